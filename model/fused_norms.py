"""The fused norms, classes of their own (as OLMo-core keeps RMSNorm and FusedRMSNorm); picked by
model.norm_impl in model/norm_config.py.

FusedRMSNorm and FusedLayerNorm compute their reference class's formula and precision policy in one
kernel each way (fused/norms.py: normlab's C++ kernel on CPU, compiled on first use; torch's
F.rms_norm / F.layer_norm on CUDA). Where the device has no kernel, the kernel cannot be built, or
the policy asks for statistics in a dtype the kernel does not use (precision=autocast under
autocast), they run the reference formula.
"""

from __future__ import annotations

import torch

from fused.norms import fused_norm
from model.norms import LayerNorm, RMSNorm


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
