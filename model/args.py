"""ModelArgs: every architectural choice of the decoder, torch-free so configs can import it cheaply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelArgs:
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None -> n_heads (plain multi-head attention)
    vocab_size: int = 4096
    hidden_dim: int | None = None  # SwiGLU width; None -> LLaMA rule from dim and multiple_of
    multiple_of: int = 32
    ffn_dim_multiplier: float | None = None
    norm: str = "rmsnorm"  # a name in model/norms.py NORMS
    norm_impl: str = "reference"  # reference | fast (the fused kernel where the norm has one: fused/norms.py)
    ops_impl: str = "reference"  # reference | fast: cross-entropy and SwiGLU (see model/ops.py)
    norm_eps: float = 1e-5
    norm_bias: bool = False  # LayerNorm only: adds the bias b; off so mean-centring is the only difference
    norm_precision: str = "float32"  # float32 | autocast: the dtype of the norms' statistics (model/norms.py)
    placement: str = "pre"  # a name in model/blocks.py BLOCKS: pre | post | peri | reordered | deepnorm
    ffn: str = "swiglu"  # a name in model/layers.py FFNS: swiglu (LLaMA) | relu (the original Transformer)
    linear_bias: bool = False  # biases in every linear layer of the blocks, initialized to 0 (GPT-2); LLaMA has none
    qk_norm: bool = False  # the model's norm applied per head to q and k
    rope_theta: float = 10000.0
    max_seq_len: int = 256
    tie_embeddings: bool = False
    init_std: float = 0.02
    init_residual: str = "scaled"  # scaled: wo, w2 ~ init_std / sqrt(2 n_layers) (GPT-2) | plain: init_std
    init_embedding_std: float | None = None  # None -> init_std (Takase et al. 2023 study larger embeddings)
    init_embedding_mean: float = 0.0  # != 0: every token's features start shifted by this (a mean shift)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

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
                raise ValueError(f"model.{name} must be positive or null, got {getattr(self, name)}")
        if self.ffn_dim_multiplier is not None and self.ffn_dim_multiplier <= 0:
            raise ValueError(f"model.ffn_dim_multiplier must be positive or null, got {self.ffn_dim_multiplier}")
        if self.dim % self.n_heads:
            raise ValueError(f"model.dim={self.dim} must be divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must be a multiple of model.n_kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even for RoPE")
        if self.norm_bias and self.norm != "layernorm":
            raise ValueError(f"model.norm_bias is defined for layernorm only, not model.norm={self.norm!r}")
        if self.norm_eps <= 0 or self.init_std < 0 or self.rope_theta <= 0:
            raise ValueError("model.norm_eps and model.rope_theta must be > 0 and model.init_std >= 0")
        if self.init_embedding_std is not None and self.init_embedding_std < 0:
            raise ValueError(f"model.init_embedding_std must be >= 0 or null, got {self.init_embedding_std}")
        lookup(RESIDUAL_INITS, self.init_residual, "init_residual")
        if self.norm_precision not in ("float32", "autocast"):  # model/norms.py NORM_PRECISIONS (torch-free here)
            raise ValueError(f"unknown norm_precision {self.norm_precision!r}; valid: autocast, float32")
        return self


# how the residual projections (attention.wo, feed_forward.w2) are drawn: their std is init_std times this
RESIDUAL_INITS = {"scaled": lambda n_layers: 1 / (2 * n_layers) ** 0.5, "plain": lambda n_layers: 1.0}


def lookup(registry: dict, name: str, kind: str):
    """registry[name], or a ValueError that lists the valid names."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(registry))}")
    return registry[name]
