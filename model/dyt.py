"""DyT and Derf: normalization-free layers that squash each unit with a learnable scale where a norm
would divide by a statistic (eps unused). They take a norm's arguments and precision policy
(model/norms.py), so --norm dyt swaps them in like any norm."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from model.args import lookup
from model.norms import LOCATIONS, Shape, _Norm


@dataclass(frozen=True)
class DyTOptions:
    """model.norm_options.dyt: alpha0 by location (the LLaMA 7B recipe: 0.8 / 0.2 / 0.2) and b."""

    alpha_attn: float = 0.5  # alpha0 of the norms before attention (0.5: the paper's default)
    alpha_ffn: float = 0.5  # ... before the feed-forward
    alpha_final: float = 0.5  # ... of the final norm
    bias: bool = True  # b (the paper's LLaMA DyT has none)

    def __post_init__(self):
        for name in ("alpha_attn", "alpha_ffn", "alpha_final"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def at(self, location: str) -> dict:
        alpha0 = dict(
            zip(LOCATIONS, (self.alpha_attn, self.alpha_ffn, self.alpha_final), strict=True)
        )
        return {"alpha0": lookup(alpha0, location, "norm location"), "bias": self.bias}


class DyT(_Norm):
    """y = g * tanh(alpha x) (+ b), alpha a learnable scalar from alpha0   (Zhu et al., 2025).

    "Transformers without Normalization": element-wise, no statistics, so eps is unused; tanh in
    float32 like the other norms' statistics."""

    Options = DyTOptions

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        precision: str = "float32",
        alpha0: float = 0.5,
    ):
        self.alpha, self.alpha0 = None, alpha0
        super().__init__(normalized_shape, eps, elementwise_affine, bias=bias, precision=precision)
        # 1-D: FSDP2 cannot shard a 0-dim parameter
        self.alpha = nn.Parameter(torch.full((1,), self.alpha0))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.alpha is not None:
            nn.init.constant_(self.alpha, self.alpha0)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha.to(x.dtype) * x)


@dataclass(frozen=True)
class DerfOptions(DyTOptions):
    """model.norm_options.derf: alpha0 by location and s0 (the paper's GPT-2 code: 1.0 and 0)."""

    alpha_attn: float = 1.0  # alpha0 before attention (Chen et al.'s language-model setting)
    alpha_ffn: float = 1.0  # ... before the feed-forward
    alpha_final: float = 1.0  # ... of the final norm
    shift: float = 0.0  # s0, the learnable shift's initial value
    bias: bool = True  # b (the paper's code keeps it)

    def at(self, location: str) -> dict:
        return {**super().at(location), "shift0": self.shift}


class Derf(_Norm):
    """y = g * erf(alpha x + s) (+ b), alpha and s learnable scalars from alpha0 and s0
    (Chen et al. 2025, "Stronger Normalization-Free Transformers", arXiv 2512.10938).

    DyT's form with erf for tanh and a learnable shift inside it; torch.erf, not the Gaussian CDF.
    The paper's language model (its nanoGPT patch) starts alpha at 1.0 everywhere, s at 0, and
    keeps DyT's learnable sqrt(d) scalar on the embedding (model.embed_scale: sqrt_dim)."""

    Options = DerfOptions

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        precision: str = "float32",
        alpha0: float = 1.0,
        shift0: float = 0.0,
    ):
        self.alpha = self.shift = None
        self.alpha0, self.shift0 = alpha0, shift0
        super().__init__(normalized_shape, eps, elementwise_affine, bias=bias, precision=precision)
        # 1-D: FSDP2 cannot shard a 0-dim parameter
        self.alpha = nn.Parameter(torch.full((1,), self.alpha0))
        self.shift = nn.Parameter(torch.full((1,), self.shift0))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.alpha is not None:
            nn.init.constant_(self.alpha, self.alpha0)
            nn.init.constant_(self.shift, self.shift0)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erf(self.alpha.to(x.dtype) * x + self.shift.to(x.dtype))
