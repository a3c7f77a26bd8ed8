"""The norms, written from their formulas: one precision policy, their options, one registry, NORMS.

Precision policy shared by every norm (LLaMA / Hugging Face order): normalize in (at least) float32,
cast the result back to the input dtype, then multiply by the gain (and add the bias).
`precision="autocast"` is the naive mixed-precision norm this policy guards against, kept so its
failures can be measured: the statistics are computed in the autocast dtype when autocast is on
(bfloat16 rounds the mean square to 8 bits of mantissa; in float16 x^2 overflows to inf for |x| >
256 and the row becomes 0, and the backward of rsqrt, -r^3 / 2, overflows for an input RMS below
65504^(-1/3) = 0.025), in the input's dtype otherwise. RMSNorm and LayerNorm take the same `eps`, so
by default the only difference between them is LayerNorm's mean-centring.

A norm's own hyperparameters are its Options (a dataclass: model.norm_options.<name> in a config);
DyT and Derf, which squash rather than normalize, are model/dyt.py; the fused kernels are classes of
their own (model/fused_norms.py); model/norm_config.py holds the registry NORMS and builds any norm
of any implementation. Adding a norm is a class and a line in NORMS: validation, --norm, help texts,
tests and studies read the registry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from model.args import lookup

Shape = int | tuple[int, ...] | list[int] | torch.Size
NORM_PRECISIONS = {
    "float32": "statistics in (at least) float32, whatever the input or autocast dtype",
    "autocast": "statistics in the autocast dtype when autocast is on, else the input's dtype",
}
# where a model builds a norm (a peri block's output norms count as their sublayer's)
LOCATIONS = ("attention", "ffn", "final")


@dataclass(frozen=True)
class NoOptions:
    """A norm without options of its own."""

    def at(self, location: str) -> dict:
        """The norm's keyword arguments at `location` (one of LOCATIONS)."""
        return dataclasses.asdict(self)


class _Norm(nn.Module):
    """Gain (and an optional bias) over the last len(normalized_shape) dims of normalize(x)."""

    # the norm's own options (model.norm_options.<name>), as its keyword arguments
    Options = NoOptions

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = False,
        precision: str = "float32",
    ):
        super().__init__()
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        lookup(NORM_PRECISIONS, precision, "norm_precision")  # a ValueError listing the valid ones
        self.precision = precision
        self.weight = nn.Parameter(torch.empty(shape)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.empty(shape)) if elementwise_affine and bias else None
        self.dims = tuple(range(-len(shape), 0))  # the normalized (last) dims
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gain 1, bias 0: the norm starts as the bare normalization."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError unless x's last dims are normalized_shape (as F.layer_norm requires)."""
        if x.shape[-len(self.normalized_shape) :] != self.normalized_shape:  # shorter x: all of it
            raise ValueError(
                f"{type(self).__name__} over normalized_shape={self.normalized_shape} got an "
                f"input of shape {tuple(x.shape)}: its last dims must be {self.normalized_shape}"
            )

    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The statistics' dtype (NORM_PRECISIONS): at least float32 under `float32`."""
        if self.precision == "autocast" and torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
        return (
            x.dtype if self.precision == "autocast" else torch.promote_types(x.dtype, torch.float32)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        y = self.normalize(x.to(self.compute_dtype(x))).type_as(x)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return (
            f"{self.normalized_shape}, eps={self.eps}, affine={self.elementwise_affine}, "
            f"bias={bias}"
            + (f", precision={self.precision}" if self.precision != "float32" else "")
        )


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x^2) + eps) * g   (Zhang & Sennrich, 2019)."""

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(self.dims, keepdim=True) + self.eps)


@dataclass(frozen=True)
class LayerNormOptions(NoOptions):
    """model.norm_options.layernorm."""

    bias: bool = False  # b: off, so mean-centring is the only difference from RMSNorm


class LayerNorm(_Norm):
    """y = (x - mean(x)) / sqrt(var(x) + eps) * g (+ b), biased variance   (Ba et al., 2016)."""

    Options = LayerNormOptions

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        xc = x - x.mean(self.dims, keepdim=True)
        return xc * torch.rsqrt(xc.pow(2).mean(self.dims, keepdim=True) + self.eps)


@dataclass(frozen=True)
class PRMSNormOptions(NoOptions):
    """model.norm_options.prmsnorm."""

    fraction: float = 0.0625  # p: the RMS from the first ceil(p d) features (the paper's 6.25%)

    def __post_init__(self):
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")


class PRMSNorm(_Norm):
    """y = x / sqrt(mean(x[:k]^2) + eps) * g, k = ceil(p d), p = fraction   (Zhang & Sennrich 2019).

    The RMS is estimated from the first k of the d features ("partial RMSNorm"; p = 6.25% in the
    paper, whose models have k = ceil(0.0625 x 512) >= 32). Several normalized dims: in flattened
    order."""

    Options = PRMSNormOptions

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = False,
        precision: str = "float32",
        fraction: float = 0.0625,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, bias=bias, precision=precision)
        self.p = fraction

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(-len(self.dims)) if len(self.dims) > 1 else x
        k = max(1, math.ceil(self.p * flat.shape[-1]))
        ms = flat[..., :k].pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(ms.view(*ms.shape[:-1], *[1] * len(self.dims)) + self.eps)


class NoNorm(nn.Module):
    """y = x: the no-normalization control; takes a norm's arguments and has no parameters."""

    Options = NoOptions

    def __init__(
        self,
        normalized_shape: Shape = (),
        eps: float = 0.0,
        elementwise_affine: bool = True,
        bias: bool = False,
        precision: str = "float32",
    ):
        super().__init__()
        self.weight = self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
