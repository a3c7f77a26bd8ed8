"""Conversion between our Llama and transformers' LlamaForCausalLM (transformers imported lazily).

Meta's LLaMA (and this repo) rotates interleaved pairs (x[2i], x[2i+1]) in RoPE; transformers
rotates the halves (x[i], x[i + d/2]). The two agree once the rows of wq and wk are permuted within
each head, exactly as transformers' own convert_llama_weights_to_hf.py does."""

from __future__ import annotations

import torch

from model.args import ModelArgs
from model.llama import Llama

# ours -> transformers; {i} is the layer index
_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
}


def check_expressible(args: ModelArgs) -> None:
    """Raise ValueError unless LlamaForCausalLM can represent the model (pre-norm RMSNorm, no
    extras: no qk-norm, no soft-capping of attention or output logits)."""
    unsupported = {
        "norm": (args.norm, "rmsnorm"),
        "placement": (args.placement, "pre"),
        "qk_norm": (args.qk_norm, "none"),
        "attn_gate": (args.attn_gate, "none"),
        "ffn": (args.ffn, "swiglu"),
        "linear_bias": (args.linear_bias, False),
        "zero_mean_writers": (args.zero_mean_writers, False),
        "embed_scale": (args.embed_scale, "none"),
        "attn_softcap": (args.attn_softcap, 0.0),
        "logit_softcap": (args.logit_softcap, 0.0),
    }
    bad = [
        f"model.{k}={got!r} (needs {need!r})"
        for k, (got, need) in unsupported.items()
        if got != need
    ]
    if bad:
        raise ValueError("transformers' LlamaForCausalLM cannot express " + ", ".join(bad))


def _permute(w: torch.Tensor, n_heads: int, to_hf: bool) -> torch.Tensor:
    """Reorder the rows of a q/k projection between interleaved (ours) and half-split (HF) RoPE
    pairs."""
    rows, cols = w.shape
    if to_hf:  # per head: (hd/2, 2) pairs -> (2, hd/2) halves
        return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_config(args: ModelArgs):
    """The LlamaConfig of a model with these args."""
    from transformers import LlamaConfig

    check_expressible(args)
    return LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=args.ffn_hidden_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_seq_len,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        tie_word_embeddings=args.tie_embeddings,
        initializer_range=args.matrix_std,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )


def _rope(config) -> tuple[float, dict]:
    """(theta, the non-default scaling settings) of a LlamaConfig in either form: transformers 5.x's
    rope_parameters (theta included) or 4.x's rope_theta plus rope_scaling (None = default RoPE)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", getattr(config, "rope_theta", 10000.0))
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
    kind = params.get("rope_type", params.get("type", "default"))
    return float(theta), ({} if kind == "default" else params)


def inexpressible(config) -> list[str]:
    """What a transformers LlamaConfig has that our Llama cannot represent (empty: it converts
    exactly)."""
    problems = []
    if getattr(config, "attention_bias", False):
        problems.append("attention_bias=True (our q/k/v/o projections have no bias)")
    if getattr(config, "mlp_bias", False):
        problems.append("mlp_bias=True (our SwiGLU projections have no bias)")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act={act!r} (our feed-forward is SwiGLU: silu only)")
    _, scaling = _rope(config)
    if scaling:
        problems.append(f"RoPE scaling {scaling} (only default RoPE is supported)")
    head_dim = getattr(config, "head_dim", None)
    if head_dim not in (None, config.hidden_size // config.num_attention_heads):
        problems.append(f"head_dim={head_dim} (ours is hidden_size / num_attention_heads)")
    return problems


def args_from_hf(config) -> ModelArgs:
    """ModelArgs equivalent to a transformers LlamaConfig; ValueError naming what cannot be
    expressed."""
    problems = inexpressible(config)
    if problems:
        raise ValueError("our Llama cannot express this LlamaConfig: " + "; ".join(problems))
    theta, _ = _rope(config)
    return ModelArgs(
        dim=config.hidden_size,
        n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        vocab_size=config.vocab_size,
        hidden_dim=config.intermediate_size,
        norm="rmsnorm",
        placement="pre",
        norm_eps=config.rms_norm_eps,
        rope_theta=theta,
        max_seq_len=config.max_position_embeddings,
        tie_embeddings=bool(config.tie_word_embeddings),
        init_std=config.initializer_range,
    )


def _key_pairs(args: ModelArgs):
    for ours, theirs in _KEYS.items():
        layers = range(args.n_layers) if "{i}" in ours else [None]
        for i in layers:
            yield ours.format(i=i), theirs.format(i=i)


def to_hf(model: Llama):
    """A LlamaForCausalLM with the same weights (and so the same logits) as `model`."""
    from transformers import LlamaForCausalLM

    args = model.args
    hf = LlamaForCausalLM(hf_config(args))
    ours = model.state_dict()
    state = {}
    for k, hk in _key_pairs(args):
        w = ours[k]
        if k.endswith(("wq.weight", "wk.weight")):
            w = _permute(w, args.n_heads if k.endswith("wq.weight") else args.kv_heads, to_hf=True)
        state[hk] = w
    hf.load_state_dict(state, strict=not args.tie_embeddings)  # tied: lm_head shares embed_tokens
    return hf.to(next(model.parameters()).dtype)


def from_hf(hf) -> Llama:
    """Our Llama with the weights of a transformers LlamaForCausalLM."""
    args = args_from_hf(hf.config)
    model = Llama(args)
    theirs = hf.state_dict()
    state = {}
    for k, hk in _key_pairs(args):
        if args.tie_embeddings and k == "output.weight":
            continue
        w = theirs[hk]
        if k.endswith(("wq.weight", "wk.weight")):
            w = _permute(w, args.n_heads if k.endswith("wq.weight") else args.kv_heads, to_hf=False)
        state[k] = w
    model.load_state_dict(state, strict=not args.tie_embeddings)
    return model.to(next(hf.parameters()).dtype)
