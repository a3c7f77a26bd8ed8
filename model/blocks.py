"""Transformer blocks that differ only in where the norm sits; f is attention or feed-forward."""

from __future__ import annotations

import torch
from torch import nn

from model.args import RESIDUAL_INITS, ModelArgs, lookup
from model.ffn import FFNS
from model.layers import Attention
from model.norm_config import NormConfig
from model.rope import Rope


def model_norm(args: ModelArgs, location: str, name: str | None = None) -> nn.Module:
    """The model's norm (args.norm unless `name`) at `location` (attention | ffn | final)."""
    name = args.norm if name is None else name
    options = args.norm_options.get(name)
    config = NormConfig(name, args.norm_impl, args.norm_eps, args.norm_precision, options)
    return config.build(args.dim, location)


class Block(nn.Module):
    """The sublayers every placement shares: attention, feed_forward and one norm per sublayer."""

    final_norm = True  # whether the decoder normalizes the residual stream before the output head
    qkv_norm = False  # whether attention normalizes each head's q, k and v with the block norm

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args, qkv_norm=args.norm if self.qkv_norm else None)
        self.feed_forward = lookup(FFNS, args.ffn, "ffn")(args)
        self.attention_norm = model_norm(args, "attention")
        self.ffn_norm = model_norm(args, "ffn")

    def reset_parameters(self, init_std: float, n_layers: int, residual: str = "scaled") -> None:
        """Every matrix ~ N(0, init_std^2), the residual projections (wo, w2) with init_std / sqrt(2
        n_layers) so the stream's variance does not grow with depth (GPT-2; `residual="plain"`:
        init_std, as Xiong et al. 2020 study Post-LN); norms reset themselves (gain 1, bias 0).

        Only matrices draw random numbers, in the order they are registered, so blocks that differ
        only in their norm or its placement start from identical weights for the same seed. A
        placement with its own init rule (e.g. DeepNorm's beta) overrides this method."""
        scale = lookup(RESIDUAL_INITS, residual, "init_residual")(n_layers)
        for name, module in self.named_modules():
            if name == "attention.w_gate":  # drawn after the head (Llama.reset_parameters)
                continue
            if isinstance(module, nn.Linear):
                is_residual = name in ("attention.wo", "feed_forward.w2")
                nn.init.normal_(module.weight, 0.0, init_std * scale if is_residual else init_std)
                if module.bias is not None:  # model.linear_bias: zero, as GPT-2 (no random draws)
                    nn.init.zeros_(module.bias)
            elif module is not self and hasattr(module, "reset_parameters"):  # norms
                module.reset_parameters()


class PreNormBlock(Block):
    """h = x + f(norm(x)) for f = attention, then feed-forward (GPT-2, LLaMA)."""

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class PostNormBlock(Block):
    """h = norm(x + f(x)) for f = attention, then feed-forward (original Transformer; Xiong et al.,
    2020)."""

    final_norm = False  # the stream is already normalized after every sublayer

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = self.attention_norm(x + self.attention(x, rope))
        return self.ffn_norm(h + self.feed_forward(h))


class PeriNormBlock(Block):
    """h = x + norm_out(f(norm_in(x))) for f = attention, then feed-forward (sandwich / peri-LN,
    Gemma 2)."""

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.attention_out_norm = model_norm(args, "attention")
        self.ffn_out_norm = model_norm(args, "ffn")

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = x + self.attention_out_norm(self.attention(self.attention_norm(x), rope))
        return h + self.ffn_out_norm(self.feed_forward(self.ffn_norm(h)))


class ReorderedNormBlock(Block):
    """h = x + norm(f(x)) for f = attention, then feed-forward: the norm moved onto the sublayer's
    output, the stream left unnormalized (OLMo 2, Team OLMo 2024; Swin Transformer v2's
    res-post-norm). `attention_norm` and `ffn_norm` therefore see sublayer outputs here, not the
    stream."""

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = x + self.attention_norm(self.attention(x, rope))
        return h + self.ffn_norm(self.feed_forward(h))


class DeepNormBlock(Block):
    """h = norm(alpha x + f(x)), alpha = (2N)^(1/4) for N layers, with wv, wo, w1, w2, w3 drawn with
    std init_std * beta, beta = (8N)^(-1/4) (DeepNet, Wang et al. 2022, decoder-only constants).
    Post-norm whose residual branch is up-weighted so each update moves the stream less; beta
    replaces init_residual."""

    final_norm = False

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.alpha = (2 * args.n_layers) ** 0.25

    def reset_parameters(self, init_std: float, n_layers: int, residual: str = "scaled") -> None:
        beta = (8 * n_layers) ** -0.25
        for name, module in self.named_modules():
            if name == "attention.w_gate":
                continue
            # same draws as Block's (normal_ scales one stream of numbers)
            if isinstance(module, nn.Linear):
                scaled = name not in ("attention.wq", "attention.wk")
                nn.init.normal_(module.weight, 0.0, init_std * beta if scaled else init_std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = self.attention_norm(self.alpha * x + self.attention(x, rope))
        return self.ffn_norm(self.alpha * h + self.feed_forward(h))


class ScaledPreNormBlock(PreNormBlock):
    """h = x + f(norm(x) / sqrt(l)) for f = attention, then feed-forward, l = layer_id + 1:
    LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth", arXiv 2502.05795, Eq. 12; OLMo-core's
    scaled block). Pre-norm whose norm outputs shrink with depth, so the stream's variance grows
    polynomially rather than exponentially and deep layers stay more than an identity. The final
    norm is not scaled."""

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.scale = (layer_id + 1) ** -0.5

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x) * self.scale, rope)
        return h + self.feed_forward(self.ffn_norm(h) * self.scale)


class MixNormBlock(Block):
    """Post-norm in the first round(alpha L) layers, pre-norm after them: Mix-LN (Li et al. 2025,
    arXiv 2412.13795; alpha = model.mix_ln_alpha, 0.25 in the paper's LLaMA runs: 3 of 12 layers at
    71M, 6 of 24 at 1B). Post-norm's large gradients where pre-norm's are small (early layers
    under-train in post-norm, deep ones in pre-norm). The final norm is kept (the last layers are
    pre-norm)."""

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.post = layer_id < round(args.mix_ln_alpha * args.n_layers)

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        if self.post:
            h = self.attention_norm(x + self.attention(x, rope))
            return self.ffn_norm(h + self.feed_forward(h))
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class HybridNormBlock(Block):
    """h = x + attention_qkv(x); out = norm(h) + f(norm(h)) for f the feed-forward: HybridNorm (Zhuo
    et al. 2025, arXiv 2503.04598, its OLMo configs: no norm before attention, the block norm over
    each head's q, k and v, and a post-norm feed-forward whose residual is the normalized stream).
    `attention_norm` is the identity (no parameters); the final norm is kept, as in its code."""

    qkv_norm = True

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.attention_norm = model_norm(args, "attention", "none")

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        h = self.ffn_norm(h)
        return h + self.feed_forward(h)


class HybridStarBlock(HybridNormBlock):
    """HybridNorm* (Zhuo et al. 2025, arXiv 2503.04598; its README's override of block 0,
    {attn_norm: True, ffn_residual: False}): the first block is pre-norm, h = x + attention_qkv(
    norm(x)); out = h + f(norm(h)), its q, k and v still normalized per head; every later block
    is HybridNorm's."""

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        self.first = layer_id == 0
        if self.first:
            self.attention_norm = model_norm(args, "attention")

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        if not self.first:
            return super().forward(x, rope)
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


BLOCKS: dict[str, type[Block]] = {
    "pre": PreNormBlock,
    "post": PostNormBlock,
    "peri": PeriNormBlock,
    "reordered": ReorderedNormBlock,
    "deepnorm": DeepNormBlock,
    "lns": ScaledPreNormBlock,
    "mixln": MixNormBlock,
    "hybrid": HybridNormBlock,
    "hybridstar": HybridStarBlock,
}


def build_block(args: ModelArgs, layer_id: int) -> Block:
    """Block `layer_id` of the placement named by args.placement."""
    return lookup(BLOCKS, args.placement, "placement")(args, layer_id)
