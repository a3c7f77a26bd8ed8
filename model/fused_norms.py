"""The fused norms, classes of their own (as OLMo-core keeps RMSNorm and FusedRMSNorm), and
build_norm, which picks a norm's class by its name and implementation (model.norm_impl, NORM_IMPLS).

FusedRMSNorm and FusedLayerNorm compute their reference class's formula and precision policy in one
kernel each way (fused/norms.py: normlab's C++ kernel on CPU, compiled on first use; torch's
F.rms_norm / F.layer_norm on CUDA). Where the device has no kernel, the kernel cannot be built, or
the policy asks for statistics in a dtype the kernel does not use (precision=autocast under
autocast), they run the reference formula.
"""

from __future__ import annotations

import torch
from torch import nn

from fused.norms import fused_norm
from model.args import lookup
from model.norms import NORMS, LayerNorm, RMSNorm, Shape, parse_options


class _Fused:
    """A fused norm's forward: the kernel where it applies, else the reference class's forward."""

    center = False  # the kernel's mode: True LayerNorm, False RMSNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if self.compute_dtype(x) == torch.promote_types(x.dtype, torch.float32):  # its policy
            y = fused_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self.center)
            if y is not None:
                return y
        return super().forward(x)


class FusedRMSNorm(_Fused, RMSNorm):
    """RMSNorm's y = x / sqrt(mean(x^2) + eps) * g through the fused kernel."""


class FusedLayerNorm(_Fused, LayerNorm):
    """LayerNorm's y = (x - mean(x)) / sqrt(var(x) + eps) * g (+ b) through the fused kernel."""

    center = True


FUSED_NORMS: dict[str, type[nn.Module]] = {"rmsnorm": FusedRMSNorm, "layernorm": FusedLayerNorm}
# an implementation is a registry of classes; under `fused` a norm without a kernel is its reference
NORM_IMPLS: dict[str, dict[str, type[nn.Module]]] = {
    "reference": NORMS,
    "fused": {**NORMS, **FUSED_NORMS},
}


def build_norm(
    name: str,
    dim: Shape,
    eps: float = 1e-5,
    impl: str = "reference",
    precision: str = "float32",
    location: str = "attention",
    options: dict | None = None,
) -> nn.Module:
    """Norm `name` over the last dims `dim`, of implementation `impl`, statistics in `precision`,
    with its options (model.norm_options.<name>) as they apply at `location` (norms.LOCATIONS)."""
    cls = lookup(lookup(NORM_IMPLS, impl, "norm_impl"), name, "norm")
    return cls(dim, eps=eps, precision=precision, **parse_options(name, options).at(location))
