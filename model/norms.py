"""The norms, written from their formulas: one precision policy, their options, one registry, NORMS.

Precision policy shared by every norm (LLaMA / Hugging Face order): normalize in (at least) float32,
cast the result back to the input dtype, then multiply by the gain (and add the bias).
`precision="autocast"` is the naive mixed-precision norm this policy guards against, kept so its
failures can be measured: the statistics are computed in the autocast dtype when autocast is on
(bfloat16 rounds the mean square to 8 bits of mantissa; in float16 x^2 overflows to inf for |x| >
256 and the row becomes 0, and the backward of rsqrt, -r^3 / 2, overflows for an input RMS below
65504^(-1/3) = 0.025), in the input's dtype otherwise. RMSNorm and LayerNorm take the same `eps`, so
by default the only difference between them is LayerNorm's mean-centring.

A norm's own hyperparameters are its Options (a dataclass: model.norm_options.<name> in a config,
checked by check_options); the fused kernels are classes of their own (model/fused_norms.py). Adding
a norm is a class here and a line in NORMS: validation, --norm, help texts, tests and studies read
the registry.
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


NORMS: dict[str, type[nn.Module]] = {
    "rmsnorm": RMSNorm,
    "layernorm": LayerNorm,
    "prmsnorm": PRMSNorm,
    "dyt": DyT,
    "derf": Derf,
    "none": NoNorm,
}


def parse_options(name: str, options: dict | None, where: str = ""):
    """Norm `name`'s Options from a mapping (model.norm_options.<name>); errors list the valid."""
    cls, where = lookup(NORMS, name, "norm").Options, where or f"norm {name}"
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options or {}) - set(valid))
    if unknown:
        raise ValueError(
            f"{where}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(valid) or 'none'}"
        )
    typed = {}
    for f in dataclasses.fields(cls):
        if f.name in (options or {}):
            typed[f.name] = _typed(options[f.name], f.type, f"{where}: {f.name}")
    try:
        return cls(**typed)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _typed(value, kind: str, where: str):
    """An option's value as its declared type (float | bool): 100 -> 100.0 (YAML reads an int)."""
    if kind not in ("float", "bool"):  # a type of its own: the Options class checks it
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{where} must be a {kind}, got {value!r}")


def check_options(norm_options: dict) -> None:
    """ValueError unless every entry of model.norm_options names a norm and valid options of it."""
    for name, options in norm_options.items():
        lookup(NORMS, name, "norm in model.norm_options")
        if not isinstance(options, dict):
            raise ValueError(
                f"model.norm_options.{name} must be a mapping of options, got {options!r}"
            )
        parse_options(name, options, f"model.norm_options.{name}")


def swap_norms(module: nn.Module, to: str) -> int:
    """Replace every LayerNorm / RMSNorm (torch's or ours) in `module` by norm `to`; the count.

    Gains are carried over; a bias is carried over when the target has one (layernorm) and dropped
    otherwise. eps is kept. Modules already of the target type are left alone.
    """
    target = lookup(NORMS, to, "norm")
    sources = (nn.LayerNorm, nn.RMSNorm, _Norm)
    swaps = [
        (parent, child_name, child)
        for parent in module.modules()
        for child_name, child in parent.named_children()
        if isinstance(child, sources) and type(child) is not target
    ]
    for parent, child_name, old in swaps:
        # nn.RMSNorm(eps=None): float32's machine epsilon
        eps = old.eps if old.eps is not None else torch.finfo(torch.float32).eps
        has_bias = getattr(old, "bias", None) is not None and to == "layernorm"
        new = target(old.normalized_shape, eps=eps, bias=has_bias)
        if getattr(old, "weight", None) is not None and getattr(new, "weight", None) is not None:
            new.weight.data.copy_(old.weight.data)
        if has_bias:
            new.bias.data.copy_(old.bias.data)
        ref = getattr(old, "weight", None)
        if ref is not None:
            new.to(device=ref.device, dtype=ref.dtype)
        setattr(parent, child_name, new)
    return len(swaps)
