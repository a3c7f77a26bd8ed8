"""The network: norms, layers, blocks and the Llama decoder. Imports nothing from training/ or
data/. `model.args` is torch-free: importing this package does not import torch until Llama is
asked for (the command line and the config loader answer before torch loads)."""

from model.args import ModelArgs

__all__ = ["ModelArgs", "Llama"]


def __getattr__(name: str):
    if name == "Llama":
        from model.llama import Llama

        return Llama
    raise AttributeError(f"module 'model' has no attribute {name!r}")
