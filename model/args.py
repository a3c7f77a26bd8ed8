"""ModelArgs: every architectural choice of the decoder, torch-free so configs can import it
cheaply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def ranged(default, spec: str, **metadata):
    """A numeric config field with the range it must lie in ('>= 1', '> 0', '[0, 1)', '(0, 1)',
    'any'), declared beside it; training/config.py holds every number a config sets to it (and
    lab/studyfile.py every number a study file sets)."""
    return field(default=default, metadata={"range": spec, **metadata})


@dataclass
class ModelArgs:
    dim: int = ranged(128, ">= 1")
    n_layers: int = ranged(4, ">= 1")
    n_heads: int = ranged(4, ">= 1")
    n_kv_heads: int | None = ranged(2, ">= 1")  # None -> n_heads (plain multi-head attention)
    vocab_size: int = ranged(4096, ">= 1")
    # SwiGLU width; None -> LLaMA rule from dim and multiple_of
    hidden_dim: int | None = ranged(None, ">= 1")
    multiple_of: int = ranged(32, ">= 1")
    ffn_dim_multiplier: float | None = ranged(None, "> 0")
    norm: str = "rmsnorm"  # a name in model/norm_config.py NORMS
    # each norm's own options by norm name, e.g. {dyt: {alpha_attn: 0.8}} (the norm class's Options)
    norm_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    norm_impl: str = "reference"  # reference | fused: the fused classes (model/fused_norms.py)
    ops_impl: str = "reference"  # reference | fused: cross-entropy and SwiGLU (see model/ops.py)
    norm_eps: float = ranged(1e-5, "> 0")
    norm_precision: str = (
        "float32"  # float32 | autocast: the dtype of the norms' statistics (model/norms.py)
    )
    placement: str = (
        "pre"  # a name in model/blocks.py BLOCKS: pre | post | peri | reordered | deepnorm | ...
    )
    # a name in model/layers.py FFNS: swiglu (LLaMA) | relu (the Transformer's) | gelu | relu2
    ffn: str = "swiglu"
    # biases in every linear layer of the blocks, initialized to 0 (GPT-2); LLaMA has none
    linear_bias: bool = False
    # none | rmsnorm | layernorm per head on q and k | olmo2: RMSNorm over q's and k's whole width
    # (QK_NORMS), its class's defaults
    qk_norm: str = "none"
    attn_gate: str = "none"  # none | elementwise | headwise: sigmoid gate on attention (ATTN_GATES)
    # placement mixln: the share of layers (first) that are post-norm
    mix_ln_alpha: float = ranged(0.25, "[0, 1]")
    qk_norm_eps: float | None = ranged(None, "> 0")  # the qk-norms' eps; None -> norm_eps
    # none | sqrt_dim: a learnable scalar times the embedding, init sqrt(dim) (DyT's LLaMA)
    embed_scale: str = "none"
    rope_theta: float = ranged(10000.0, "> 0")
    max_seq_len: int = ranged(256, ">= 1")
    tie_embeddings: bool = False
    init_std: float = ranged(0.02, ">= 0")
    init_residual: str = (
        "scaled"  # scaled: wo, w2 ~ init_std / sqrt(2 n_layers) (GPT-2) | plain: init_std
    )
    # None -> init_std (Takase et al. 2023 study larger embeddings)
    init_embedding_std: float | None = ranged(None, ">= 0")
    # != 0: every token's features start shifted by this (a mean shift)
    init_embedding_mean: float = ranged(0.0, "any")
    # > 0: attention logits -> c tanh(logits / c) (Gemma 2; explicit attention); 0 = off
    attn_softcap: float = ranged(0.0, ">= 0")
    # > 0: output logits -> c tanh(logits / c) before the loss (Gemma 2); 0 = off
    logit_softcap: float = ranged(0.0, ">= 0")
    # the output head's std; None -> init_std (an untied head only)
    init_head_std: float | None = ranged(None, ">= 0")
    # absolute | width: init_std is the std at d = 4096, x sqrt(4096 / dim) (INIT_SCALES)
    init_scale: str = "absolute"
    # keep every writer of the residual stream zero-mean over its features (the token embedding
    # centred, wo and w2 as W - mean_0(W), b - mean(b)): Pre-RMSNorm then trains exactly as Pre-LN
    # from the same seed (Jiang et al. 2023); pre-norm placements only (pre, lns)
    zero_mean_writers: bool = False

    @property
    def matrix_std(self) -> float:
        """The std every matrix of the blocks is drawn with before residual scaling (init_residual,
        DeepNorm's beta): init_std, times sqrt(4096 / dim) under init_scale=width."""
        return self.init_std * lookup(INIT_SCALES, self.init_scale, "init_scale")(self.dim)

    @property
    def embedding_std(self) -> float:
        """The token embedding's std: init_embedding_std as given (absolute), else matrix_std."""
        return self.matrix_std if self.init_embedding_std is None else self.init_embedding_std

    @property
    def head_std(self) -> float:
        """The output head's std: init_head_std as given (absolute), else matrix_std."""
        return self.matrix_std if self.init_head_std is None else self.init_head_std

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def qk_eps(self) -> float:
        return self.norm_eps if self.qk_norm_eps is None else self.qk_norm_eps

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """LLaMA's SwiGLU width: 2/3 of 4*dim (same parameter count as a 4*dim MLP), rounded up."""
        if self.hidden_dim:
            return self.hidden_dim
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def check(self) -> ModelArgs:
        """Raise ValueError on shapes the model cannot build."""
        for name in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len", "multiple_of"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        for name in ("n_kv_heads", "hidden_dim"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(
                    f"model.{name} must be positive or null, got {getattr(self, name)}"
                )
        if self.ffn_dim_multiplier is not None and self.ffn_dim_multiplier <= 0:
            raise ValueError(
                f"model.ffn_dim_multiplier must be positive or null, got {self.ffn_dim_multiplier}"
            )
        if self.dim % self.n_heads:
            raise ValueError(
                f"model.dim={self.dim} must be divisible by model.n_heads={self.n_heads}"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} must be a multiple of "
                f"model.n_kv_heads={self.kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even for RoPE")
        if self.norm_eps <= 0 or self.init_std < 0 or self.rope_theta <= 0:
            raise ValueError(
                "model.norm_eps and model.rope_theta must be > 0 and model.init_std >= 0"
            )
        for name in ("init_embedding_std", "init_head_std"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"model.{name} must be >= 0 or null, got {getattr(self, name)}")
        if self.init_head_std is not None and self.tie_embeddings:
            raise ValueError(
                "model.init_head_std needs an untied head (model.tie_embeddings=false): a tied "
                "head is "
                "the embedding, drawn with model.init_embedding_std"
            )
        lookup(INIT_SCALES, self.init_scale, "init_scale")
        lookup(RESIDUAL_INITS, self.init_residual, "init_residual")
        lookup(EMBED_SCALES, self.embed_scale, "embed_scale")
        lookup(QK_NORMS, self.qk_norm, "qk_norm")
        lookup(ATTN_GATES, self.attn_gate, "attn_gate")
        if not 0 <= self.mix_ln_alpha <= 1:
            raise ValueError(f"model.mix_ln_alpha must be in [0, 1], got {self.mix_ln_alpha}")
        if self.placement in ("hybrid", "hybridstar") and self.qk_norm != "none":
            raise ValueError(
                f"model.placement={self.placement} normalizes q, k and v with the block norm "
                f"itself: model.qk_norm must be none, got {self.qk_norm}"
            )
        if self.zero_mean_writers and self.placement not in ("pre", "lns"):
            raise ValueError(
                "model.zero_mean_writers needs a placement whose norms all read the residual "
                f"stream (pre, lns), got model.placement={self.placement}"
            )
        if self.qk_norm_eps is not None and self.qk_norm_eps <= 0:
            raise ValueError(f"model.qk_norm_eps must be > 0 or null, got {self.qk_norm_eps}")
        for name in ("attn_softcap", "logit_softcap"):
            if not getattr(self, name) >= 0:  # also catches nan
                raise ValueError(f"model.{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        # model/norms.py NORM_PRECISIONS (torch-free here)
        if self.norm_precision not in ("float32", "autocast"):
            raise ValueError(
                f"unknown norm_precision {self.norm_precision!r}; valid: autocast, float32"
            )
        return self


# how the residual projections (attention.wo, feed_forward.w2) are drawn: their std is init_std
# times this
RESIDUAL_INITS = {
    "scaled": lambda n_layers: 1 / (2 * n_layers) ** 0.5,
    "plain": lambda n_layers: 1.0,
}
# qk-norm: the norm over each head's queries and keys (Dehghani et al. 2023; Wortsman et al. 2023's
# qk-layernorm), chosen apart from the block norm; a gain per head dimension, shared by the heads,
# no bias
# (the norm, whether over q's and k's whole width before the head split: OLMo 2's, Team OLMo 2024)
QK_NORMS = {
    "none": ("none", False),
    "rmsnorm": ("rmsnorm", False),
    "layernorm": ("layernorm", False),
    "olmo2": ("rmsnorm", True),
}
# gated attention (Qiu et al. 2025, arXiv 2505.06708, its best variant G1: after SDPA, head-
# specific, multiplicative sigmoid): y_h <- y_h * sigmoid(x W_g) before wo, W_g's width per
# attention (elementwise: one gate per unit of each head, the paper's headline; headwise: one per
# head); none: no gate
ATTN_GATES = {
    "none": lambda att: 0,
    "elementwise": lambda att: att.n_heads * att.head_dim,
    "headwise": lambda att: att.n_heads,
}
# The paper-scale reference width: LLaMA 7B's d (Touvron et al. 2023). Its std 0.02 (every matrix,
# the embedding and the head: the init Zhu et al. 2025's DyT LLaMA code inherits) makes each matrix
# give a unit-RMS input outputs of RMS 0.02 x sqrt(4096) = 1.28, and the embedding times DyT's
# sqrt(d) scalar a stream of RMS 1.28; the same 0.02 at d = 64 gives 0.16 for both, and logits ~100x
# smaller: the stream's scale depends on the width.
INIT_REFERENCE_DIM = 4096
# how init_std is read: absolute (the std itself, at any width) | width (the std at
# INIT_REFERENCE_DIM; at width d it becomes init_std x sqrt(4096 / d) = c / sqrt(d), c = init_std x
# 64, so sqrt(d) x std, the scale above, is the same at every width). It scales init_std and the
# stds that default to it (the embedding's with init_embedding_std null, the head's with
# init_head_std null); an explicit init_embedding_std or init_head_std is absolute either way
INIT_SCALES = {"absolute": lambda dim: 1.0, "width": lambda dim: (INIT_REFERENCE_DIM / dim) ** 0.5}
# the initial value of a learnable scalar multiplying the embedding (None: no scalar)
EMBED_SCALES = {"none": lambda dim: None, "sqrt_dim": lambda dim: dim**0.5}


def lookup(registry: dict, name: str, kind: str):
    """registry[name], or a ValueError that lists the valid names."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(registry))}")
    return registry[name]
