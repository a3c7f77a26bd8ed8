"""The network: norms, layers, blocks and the Llama decoder. Imports nothing from training/ or
data/."""

from model.args import ModelArgs
from model.llama import Llama

__all__ = ["ModelArgs", "Llama"]
