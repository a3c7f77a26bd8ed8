"""Norm conversions of a trained model.

to_rmsnorm is exact (Jiang et al. 2023, "Pre-RMSNorm and Pre-CRMSNorm Transformers", arXiv
2305.14858): in a pre-norm model every LayerNorm reads the residual stream, and LayerNorm
ignores its mean, LN(x) = RMSNorm(x - mean(x)) (same eps: var(x) = mean((x - mean(x))^2)). So
fold each LayerNorm's gain g into the linear layers it feeds (W' = W diag(g)), re-centre every
writer of the stream over its output dimension (the token embedding E -= E.mean(-1), each
attention output and FFN down projection W -= W.mean(0), b -= mean(b)), and every LayerNorm
becomes an RMSNorm with unit gain: the stream is the old one minus its mean, which no norm sees,
and the logits are unchanged.

The same identity for a Hugging Face GPT-2 is the library's (normlab/convert.py). swap_norms is
the naive swap: every LayerNorm / RMSNorm replaced by another norm with its gain carried over;
the model then computes something else (how much: its val loss before and after)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from model.args import lookup
from model.norm_config import NORMS
from model.norms import _Norm

# placements whose norms all read the residual stream (LayerNorm's input is what the writers sum)
EXACT_PLACEMENTS = ("pre", "lns")
# the linear layers each block norm feeds
FEEDS = {
    "attention_norm": ("attention.wq", "attention.wk", "attention.wv", "attention.w_gate"),
    "ffn_norm": ("feed_forward.w1", "feed_forward.w3"),
}
WRITERS = ("attention.wo", "feed_forward.w2")  # what each block adds to the stream


def refusal(args) -> str | None:
    """Why a model of these ModelArgs has no exact LayerNorm -> RMSNorm conversion, or None."""
    if args.norm != "layernorm":
        return f"its norm is {args.norm!r}, not 'layernorm'"
    if args.placement not in EXACT_PLACEMENTS:
        return (
            f"its placement is {args.placement!r}: the identity needs every norm to read the "
            f"residual stream (placements {', '.join(EXACT_PLACEMENTS)}); a norm after the "
            "residual sum sees a mean no writer's centring removes"
        )
    if (args.norm_options.get("layernorm") or {}).get("bias"):
        return "its LayerNorms have a bias, which the output head (no bias) cannot absorb"
    return None  # qk-norm, gates, soft-capping, embed_scale act past the stream's norms


@torch.no_grad()
def to_rmsnorm(model: nn.Module) -> nn.Module:
    """The pre-RMSNorm Llama computing the same logits as pre-LN `model` (module docstring); the
    algebra in float64, the result in model's dtype and device. The head is untied (the embedding
    is re-centred as a writer, the head keeps its rows with the final gain folded in). ValueError
    (refusal's reason) for a model without the identity."""
    from model.llama import Llama

    args = model.args
    reason = refusal(args)
    if reason:
        raise ValueError(f"no exact LayerNorm -> RMSNorm conversion: {reason}")
    sd = {k: v.detach().to(torch.float64).clone() for k, v in model.state_dict().items()}
    for i in range(args.n_layers):
        p = f"layers.{i}."
        for norm, feeds in FEEDS.items():
            g = sd.pop(p + norm + ".weight")
            for name in feeds:
                if p + name + ".weight" in sd:
                    sd[p + name + ".weight"] *= g  # W diag(g): column j times g_j
        for name in WRITERS:
            sd[p + name + ".weight"] -= sd[p + name + ".weight"].mean(0, keepdim=True)
            if p + name + ".bias" in sd:
                sd[p + name + ".bias"] -= sd[p + name + ".bias"].mean()
    sd["output.weight"] = sd["output.weight"] * sd.pop("norm.weight")
    sd["tok_embeddings.weight"] -= sd["tok_embeddings.weight"].mean(-1, keepdim=True)
    options = {k: v for k, v in args.norm_options.items() if k != "layernorm"}
    new_args = dataclasses.replace(
        args, norm="rmsnorm", norm_options=options, tie_embeddings=False, init_head_std=None
    )
    weight = model.output.weight
    with torch.device("meta"):
        new = Llama(new_args)
    new = new.to_empty(device=weight.device).to(weight.dtype)
    missing = {k for k in new.state_dict() if k not in sd}
    for k in missing:  # the RMSNorms' gains: 1
        if not k.endswith("norm.weight"):
            raise ValueError(f"to_rmsnorm: no value for {k}")
        sd[k] = torch.ones_like(new.state_dict()[k], dtype=torch.float64)
    new.load_state_dict(sd)  # copies, casting to each parameter's dtype
    return new.train(model.training)


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
