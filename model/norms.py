"""The norms, written from their formulas, with one precision policy, one registry (NORMS) and swap_norms.

Precision policy shared by every norm (LLaMA / Hugging Face order): normalize in (at least) float32, cast the
result back to the input dtype, then multiply by the gain (and add the bias). `precision="autocast"` is the
naive mixed-precision norm this policy guards against, kept so its failures can be measured: the statistics
are computed in the autocast dtype when autocast is on (bfloat16 rounds the mean square to 8 bits of mantissa;
in float16 x^2 overflows to inf for |x| > 256 and the row becomes 0, and the backward of rsqrt, -r^3 / 2, overflows
for an input RMS below 65504^(-1/3) = 0.025), in the input's dtype otherwise. RMSNorm and LayerNorm take the same
`eps`, so by default the only difference between them is LayerNorm's mean-centring.

`impl="fast"` runs a norm through its fused kernel (fused/norms.py) where it has one (`center` is not None)
and the device has one; otherwise, and always with `impl="reference"`, it runs the formula below. Adding a norm
is a class here and a line in NORMS: validation, --norm, help texts, tests and studies read the registry.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fused.norms import fused_norm
from model.args import lookup

Shape = int | tuple[int, ...] | list[int] | torch.Size
NORM_IMPLS = {"reference": "the formula in eager torch ops",
              "fast": "a fused kernel where the norm has one (fused/), else the formula"}
NORM_PRECISIONS = {"float32": "statistics in (at least) float32, whatever the input or autocast dtype",
                   "autocast": "statistics in the autocast dtype when autocast is on, else in the input's dtype"}


class _Norm(nn.Module):
    """Gain (and optional bias) over the last len(normalized_shape) dims; subclasses define normalize()."""

    center: bool | None = None  # the fused kernel's mode: True LayerNorm, False RMSNorm, None no kernel

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = False, impl: str = "reference", precision: str = "float32"):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        lookup(NORM_IMPLS, impl, "norm_impl")  # a ValueError listing the valid ones
        self.impl = impl
        lookup(NORM_PRECISIONS, precision, "norm_precision")
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
        """ValueError unless x's last dims are normalized_shape (as torch's F.layer_norm requires)."""
        if x.shape[-len(self.normalized_shape):] != self.normalized_shape:  # (a shorter x: its whole shape)
            raise ValueError(f"{type(self).__name__} over normalized_shape={self.normalized_shape} got an input of "
                             f"shape {tuple(x.shape)}: its last dims must be {self.normalized_shape}")

    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype the statistics are computed in (see NORM_PRECISIONS): float32 policy: at least float32
        (bfloat16/float16 are upcast, float64 stays float64 for gradcheck)."""
        if self.precision == "autocast" and torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
        return x.dtype if self.precision == "autocast" else torch.promote_types(x.dtype, torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        # the fused kernel has the float32 policy; the "autocast" policy gives it when autocast is off and x has
        # at least float32 (compute_dtype only asked then: it costs a microsecond a call, as much as a small row)
        if self.impl == "fast" and self.center is not None and (
                self.precision == "float32" or self.compute_dtype(x) == torch.promote_types(x.dtype, torch.float32)):
            y = fused_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self.center)
            if y is not None:
                return y
        y = self.normalize(x.to(self.compute_dtype(x))).type_as(x)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return (f"{self.normalized_shape}, eps={self.eps}, affine={self.elementwise_affine}, bias={bias}, "
                f"impl={self.impl}" + (f", precision={self.precision}" if self.precision != "float32" else ""))


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x^2) + eps) * g   (Zhang & Sennrich, 2019)."""

    center = False

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(self.dims, keepdim=True) + self.eps)


class LayerNorm(_Norm):
    """y = (x - mean(x)) / sqrt(var(x) + eps) * g (+ b), biased variance   (Ba et al., 2016)."""

    center = True

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        xc = x - x.mean(self.dims, keepdim=True)
        return xc * torch.rsqrt(xc.pow(2).mean(self.dims, keepdim=True) + self.eps)


class PRMSNorm(_Norm):
    """y = x / sqrt(mean(x[:k]^2) + eps) * g, k = ceil(p * d): the RMS estimated from the first p of the d
    features (Zhang & Sennrich, 2019, "partial RMSNorm"; p = 6.25% as in the paper). Over several normalized
    dims the features are taken in flattened order."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = False, impl: str = "reference", precision: str = "float32", fraction: float = 0.0625):
        super().__init__(normalized_shape, eps, elementwise_affine, bias=bias, impl=impl, precision=precision)
        self.p = fraction  # model.prms_fraction; k = ceil(p d) >= 32 in the paper's models (p d = 0.0625 x 512)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(-len(self.dims)) if len(self.dims) > 1 else x
        k = max(1, math.ceil(self.p * flat.shape[-1]))
        ms = flat[..., :k].pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(ms.view(*ms.shape[:-1], *[1] * len(self.dims)) + self.eps)


class DyT(_Norm):
    """y = g * tanh(alpha * x) (+ b), alpha a learnable scalar   (Zhu et al., 2025, "Transformers without
    Normalization"). Element-wise: no statistics, so eps is unused. alpha starts at alpha0: 0.5, the paper's
    default, or per location (model.dyt_alpha_attn / _ffn / _final) as its LLaMA recipe sets it (7B: 0.8 before
    attention, 0.2 elsewhere); b is on by default, off in that recipe (model.dyt_bias). tanh is taken in float32
    like the other norms' statistics."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, impl: str = "reference", precision: str = "float32", alpha0: float = 0.5):
        self.alpha, self.alpha0 = None, alpha0
        super().__init__(normalized_shape, eps, elementwise_affine, bias=bias, impl=impl, precision=precision)
        self.alpha = nn.Parameter(torch.full((1,), self.alpha0))  # 1-D: FSDP2 cannot shard a 0-dim parameter

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.alpha is not None:
            nn.init.constant_(self.alpha, self.alpha0)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha.to(x.dtype) * x)


class NoNorm(nn.Module):
    """y = x: the no-normalization control; takes a norm's arguments and has no parameters."""

    def __init__(self, normalized_shape: Shape = (), eps: float = 0.0, elementwise_affine: bool = True, **options):
        super().__init__()  # a norm's options (bias, precision, DyT's alpha0, ...) mean nothing here
        self.weight = self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


NORMS: dict[str, type[nn.Module]] = {"rmsnorm": RMSNorm, "layernorm": LayerNorm, "prmsnorm": PRMSNorm, "dyt": DyT,
                                     "none": NoNorm}


def build_norm(name: str, dim: Shape, eps: float = 1e-5, impl: str = "reference", precision: str = "float32",
               **options) -> nn.Module:
    """The norm called `name` over the last dims of shape `dim`; `impl` picks the fused kernel or the formula,
    `precision` the dtype of its statistics (NORM_PRECISIONS); `options` are the norm's own (bias; DyT's alpha0,
    pRMSNorm's fraction: model/args.py norm_options)."""
    return lookup(NORMS, name, "norm")(dim, eps=eps, impl=impl, precision=precision, **options)


def swap_norms(module: nn.Module, to: str, impl: str = "reference") -> int:
    """Replace every LayerNorm / RMSNorm (torch's or ours) inside `module` by norm `to`; return the count.

    Gains are carried over; a bias is carried over when the target has one (layernorm) and dropped
    otherwise. eps is kept. Modules already of the target type and implementation are left alone.
    """
    target = lookup(NORMS, to, "norm")
    lookup(NORM_IMPLS, impl, "norm_impl")
    sources = (nn.LayerNorm, nn.RMSNorm, _Norm)
    swaps = [(parent, child_name, child)
             for parent in module.modules()
             for child_name, child in parent.named_children()
             if isinstance(child, sources) and not (type(child) is target and getattr(child, "impl", None) == impl)]
    for parent, child_name, old in swaps:
        eps = old.eps if old.eps is not None else torch.finfo(torch.float32).eps  # nn.RMSNorm(eps=None)
        has_bias = getattr(old, "bias", None) is not None and to == "layernorm"
        new = target(old.normalized_shape, eps=eps, bias=has_bias, impl=impl)
        if getattr(old, "weight", None) is not None and getattr(new, "weight", None) is not None:
            new.weight.data.copy_(old.weight.data)
        if has_bias:
            new.bias.data.copy_(old.bias.data)
        ref = getattr(old, "weight", None)
        if ref is not None:
            new.to(device=ref.device, dtype=ref.dtype)
        setattr(parent, child_name, new)
    return len(swaps)
