"""normlab, the library: a training-stability monitor for any PyTorch model and loop.

    from normlab import Monitor                      # a plain loop (normlab/monitor.py)
    from normlab.hf import add_monitor               # transformers' Trainer
    from normlab.lightning import StabilityCallback  # Lightning
    python -m normlab.inspect RUN [RUN ...]          # one page of runs, spikes by step

The core (normlab/probe.py) computes per-layer gradient, parameter and update norms, activation
RMS, what the norms that read the residual stream receive (their mean-energy fraction), the
largest attention logit and output-logit statistics from tensors its hooks are handed; a Layout
(normlab/layout.py) says where a model keeps them; spikes and their precursors are
normlab/spikes.py; the exact Hugging Face LayerNorm -> RMSNorm conversion is normlab/convert.py.
torch is the only dependency; transformers, lightning, tensorboard, wandb and matplotlib are used
where asked for."""

import importlib

# what `from normlab import X` gives, imported on first use: `python -m normlab.inspect` reads runs
# without importing torch
_WHERE = {
    "Layout": "normlab.layout",
    "find_layout": "normlab.layout",
    "normlab_layout": "normlab.layout",
    "Monitor": "normlab.monitor",
    "StabilityProbe": "normlab.probe",
    "SpikeDetector": "normlab.spikes",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'normlab' has no attribute {name!r}")
