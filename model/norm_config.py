"""The norm factory: the registry NORMS, each norm's options parsed from a config, and NormConfig,
which builds any norm of any implementation (as OLMo-core's LayerNormConfig(...).build(size)):

    NormConfig("layernorm", impl="fused", eps=1e-5).build(dim, location="ffn")
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torch import nn

from model.args import lookup
from model.dyt import Derf, DyT
from model.fused_norms import FusedLayerNorm, FusedRMSNorm
from model.norms import LayerNorm, NoNorm, PRMSNorm, RMSNorm, Shape

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
        if not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
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


FUSED_NORMS: dict[str, type[nn.Module]] = {"rmsnorm": FusedRMSNorm, "layernorm": FusedLayerNorm}
# an implementation is a registry of classes; under `fused` a norm without a kernel is its reference
NORM_IMPLS: dict[str, dict[str, type[nn.Module]]] = {
    "reference": NORMS,
    "fused": {**NORMS, **FUSED_NORMS},
}


@dataclass(frozen=True)
class NormConfig:
    """A norm by name (NORMS) and implementation (NORM_IMPLS), its eps, its statistics' precision
    (norms.NORM_PRECISIONS) and its own options (model.norm_options.<name>)."""

    name: str = "rmsnorm"
    impl: str = "reference"
    eps: float = 1e-5
    precision: str = "float32"
    options: dict | None = None

    def build(self, dim: Shape, location: str = "attention") -> nn.Module:
        """The norm over the last dims `dim`, its options as they apply at `location`
        (norms.LOCATIONS: attention | ffn | final)."""
        cls = lookup(lookup(NORM_IMPLS, self.impl, "norm_impl"), self.name, "norm")
        kwargs = parse_options(self.name, self.options).at(location)
        return cls(dim, eps=self.eps, precision=self.precision, **kwargs)
