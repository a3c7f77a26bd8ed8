"""Grouped-query causal attention (the feed-forwards are model/ffn.py), and `writer`: a layer that
writes to the residual stream."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.args import ATTN_GATES, QK_NORMS, ModelArgs, lookup
from model.norm_config import NormConfig
from model.rope import Rope, apply_rope


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"  # without importing torch.distributed on every forward


def expand_kv(q: torch.Tensor) -> bool:
    """Whether grouped-query attention should repeat its k/v heads rather than ask SDPA for
    enable_gqa: on CUDA in float32, where only the math kernel implements enable_gqa (flash, which
    has it, needs float16 / bfloat16; the memory-efficient and cuDNN kernels need equal head
    counts). Elsewhere enable_gqa (no copy of k and v). The dtype that counts is the one SDPA runs
    in: under autocast q may be float32 here (RoPE's float32 tables promote it) while SDPA casts it
    to the autocast dtype."""
    return runs_in_float32(
        q.device.type,
        q.dtype,
        torch.is_autocast_enabled(q.device.type),
        torch.get_autocast_dtype(q.device.type),
    )


def runs_in_float32(
    device: str, dtype: torch.dtype, autocast: bool, autocast_dtype: torch.dtype
) -> bool:
    """expand_kv's decision from plain values (testable without a GPU)."""
    return device == "cuda" and (autocast_dtype if autocast else dtype) == torch.float32


class ZeroMeanLinear(nn.Linear):
    """y = x (W - 1 mean_0(W))^T + (b - mean(b)): outputs with zero mean over their features, for
    any x (Jiang et al. 2023's LinearZeroMeanOutput). The raw W and b are the parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias - self.bias.mean()
        return F.linear(x, self.weight - self.weight.mean(0, keepdim=True), bias)


def writer(args: ModelArgs, d_in: int, d_out: int) -> nn.Linear:
    """A projection that writes to the residual stream: zero-mean under model.zero_mean_writers."""
    cls = ZeroMeanLinear if args.zero_mean_writers else nn.Linear
    return cls(d_in, d_out, bias=args.linear_bias)


class Attention(nn.Module):
    """softmax(q k^T / sqrt(d_head) + causal mask) v with n_kv_heads <= n_heads shared key/value
    heads."""

    def __init__(self, args: ModelArgs, qkv_norm: str | None = None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        bias = args.linear_bias
        self.wq = nn.Linear(args.dim, self.n_heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.wo = writer(args, self.n_heads * self.head_dim, args.dim)
        # gated attention: each head's output times sigmoid(x W_g) before wo (ATTN_GATES)
        gate = lookup(ATTN_GATES, args.attn_gate, "attn_gate")(self)
        with torch.random.fork_rng(devices=[]):  # Linear's own init draws leave the stream as is
            self.w_gate = nn.Linear(args.dim, gate, bias=bias) if gate else None
        impl, precision = args.norm_impl, args.norm_precision
        if qkv_norm is not None:  # the block's own norm over each head's q, k and v (HybridNorm)
            own = NormConfig(
                qkv_norm, impl, args.norm_eps, precision, args.norm_options.get(qkv_norm)
            )
            self.q_norm, self.k_norm, self.v_norm = (own.build(self.head_dim) for _ in range(3))
            self.full_qk = False
        else:
            # qk-norm: a norm over each head's q and k, or over q's and k's whole width before
            # the head split (OLMo 2) (QK_NORMS: its own eps, its class's default options: a gain,
            # no bias) bounds the attention logits
            name, self.full_qk = lookup(QK_NORMS, args.qk_norm, "qk_norm")
            width = (self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim)
            q_dim, k_dim = width if self.full_qk else (self.head_dim, self.head_dim)
            qk = NormConfig(name, impl, args.qk_eps, precision)
            self.q_norm, self.k_norm = qk.build(q_dim), qk.build(k_dim)
            self.v_norm = NormConfig("none").build(self.head_dim)
        self.softcap = args.attn_softcap
        # QK-Clip (training/controls.py): each head's max logit over the training forward passes
        # since the last step, recorded only when asked for
        self.track_max_logit, self.max_logit = False, None

    def project(self, x: torch.Tensor, rope: Rope, values: bool = True):
        """q (B, n_heads, T, hd) and k (B, n_kv_heads, T, hd), normalized and rotated, and v (or
        None)."""
        B, T, _ = x.shape
        linears = [self.wq, self.wk] + ([self.wv] if values else [])
        # tensor parallel: each projection is its own column-sharded matmul
        if _is_dtensor(self.wq.weight):
            q, k, *v = (m(x) for m in linears)
        # one matmul for the projections: faster than three small ones, same parameters (wq, wk, wv)
        else:
            heads = [self.n_heads, self.n_kv_heads] + ([self.n_kv_heads] if values else [])
            bias = torch.cat([m.bias for m in linears]) if self.wq.bias is not None else None
            q, k, *v = F.linear(x, torch.cat([m.weight for m in linears]), bias).split(
                [h * self.head_dim for h in heads], dim=-1
            )
        if self.full_qk:  # over the whole width, before the head split (OLMo 2)
            q, k = self.q_norm(q), self.k_norm(k)
        # heads from the shapes (-1): under tensor parallelism a rank holds n_heads / tp of them
        q, k = q.view(B, T, -1, self.head_dim), k.view(B, T, -1, self.head_dim)
        if not self.full_qk:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, rope).transpose(1, 2)
        k = apply_rope(k, rope).transpose(1, 2)
        if not v:
            return q, k, None
        return q, k, self.v_norm(v[0].view(B, T, -1, self.head_dim)).transpose(1, 2)

    def qk(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys as attention sees them (used by the attention-logit probe)."""
        return self.project(x, rope, values=False)[:2]

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project(x, rope)
        if self.track_max_logit and torch.is_grad_enabled():  # training passes, not evals
            peak = max_logit(q, k)
            self.max_logit = peak if self.max_logit is None else torch.maximum(self.max_logit, peak)
        if self.softcap:  # SDPA's fused kernels never materialize the logits: nothing to cap there
            y = explicit_attention(q, k, v, self.softcap)
        else:
            gqa = q.shape[1] != k.shape[1]
            # share each kv head with its query group explicitly: keeps a fused kernel
            if gqa and expand_kv(q):
                k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
                gqa = False
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        y = y.transpose(1, 2)  # (B, T, H, hd)
        if self.w_gate is not None:  # per head (B, T, H, 1) or per unit (B, T, H, hd)
            y = y * torch.sigmoid(self.w_gate(x)).view(B, T, y.shape[2], -1)
        return self.wo(y.reshape(B, T, -1))  # (B, T, H * hd)


@torch.no_grad()
def max_logit(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Each query head's largest causal logit q k^T / sqrt(d_head) over the batch: (n_heads,)."""
    H, T, hd = q.shape[1], q.shape[2], q.shape[3]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).amax(dim=(0, 2, 3))


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2's logit soft-capping): ~x for |x| << cap, bounded by +-cap; cap
    0: x."""
    return cap * torch.tanh(x / cap) if cap else x


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cap: float = 0.0
) -> torch.Tensor:
    """softmax(causal mask(softcap(q k^T / sqrt(d_head)))) v, with the logits materialized: q (B, H,
    T, hd), k and v (B, kv, T, hd), kv dividing H. The products run in the matmul's dtype
    (autocast's, as SDPA would), the scaling, cap and softmax in float32 (float64 stays float64),
    the weights cast back to v's dtype; cap 0 is SDPA's math."""
    H, T, hd = q.shape[1], q.shape[2], q.shape[3]
    # each kv head to its query group
    k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2)  # (B, H, T, T)
    logits = softcap(
        scores.to(torch.promote_types(scores.dtype, torch.float32)) / math.sqrt(hd), cap
    )
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    weights = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    return weights.to(v.dtype) @ v


def attention_path(args: ModelArgs) -> str:
    """Which attention computation a model of these args runs (for meta.json's `kernels`)."""
    if args.attn_softcap:
        return (
            f"explicit q k^T / sqrt(d) -> softcap {args.attn_softcap:g} -> causal mask -> softmax "
            "-> v "
            f"(SDPA's fused kernels never materialize the logits to cap)"
        )
    return (
        "torch scaled_dot_product_attention (causal; its fused kernels where the device has them)"
    )
