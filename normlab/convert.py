"""Exact LayerNorm -> RMSNorm conversion of a Hugging Face pre-LN model (Jiang et al. 2023,
"Pre-RMSNorm and Pre-CRMSNorm Transformers", arXiv 2305.14858): every LayerNorm of a pre-LN model
reads the residual stream and ignores its mean, LN(x) = RMSNorm(x - mean(x)); fold each LayerNorm's
gain g and bias beta into the layers it feeds (W' = diag(g) W, b' = b + W beta), re-centre every
writer of the stream over its output dimension, and every LayerNorm becomes an RMSNorm with unit
gain computing the same logits. torch only: the model is passed in (transformers is not
imported)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def gpt2_to_rmsnorm(model: nn.Module) -> nn.Module:
    """A transformers GPT2LMHeadModel (pre-LN) converted in place to RMSNorm modules (torch's
    nn.RMSNorm, gain 1) with the same logits; its head untied and given a bias. Conv1D weights
    are (in, out): a gain folds into rows, writers centre over columns. Save it whole
    (torch.save(model); torch.load(path, weights_only=False)): save_pretrained would rebuild
    LayerNorms."""
    cfg = model.config
    if cfg.model_type != "gpt2":
        raise ValueError(
            f"no exact LayerNorm -> RMSNorm conversion for model_type {cfg.model_type!r}: "
            "this converter knows GPT-2's layout (model_type gpt2)"
        )
    t = model.transformer
    if any(not isinstance(m, nn.LayerNorm) for m in (t.ln_f, *(b.ln_1 for b in t.h))):
        raise ValueError("no exact LayerNorm -> RMSNorm conversion: the model has no LayerNorms")

    def fold(ln: nn.LayerNorm, conv) -> None:
        w, g = conv.weight.double(), ln.weight.double()
        beta = ln.bias.double() if ln.bias is not None else torch.zeros_like(g)
        conv.bias.copy_(conv.bias.double() + beta @ w)
        conv.weight.copy_(w * g[:, None])

    def centre(conv) -> None:
        w = conv.weight.double()
        conv.weight.copy_(w - w.mean(1, keepdim=True))
        conv.bias.copy_(conv.bias.double() - conv.bias.double().mean())

    def rms(ln: nn.LayerNorm) -> nn.RMSNorm:
        return nn.RMSNorm(ln.normalized_shape, eps=ln.eps).to(ln.weight.device, ln.weight.dtype)

    emb = t.wte.weight.double().clone()
    for block in t.h:
        fold(block.ln_1, block.attn.c_attn)
        fold(block.ln_2, block.mlp.c_fc)
        centre(block.attn.c_proj)
        centre(block.mlp.c_proj)
        block.ln_1, block.ln_2 = rms(block.ln_1), rms(block.ln_2)
    g = t.ln_f.weight.double()
    beta = t.ln_f.bias.double() if t.ln_f.bias is not None else torch.zeros_like(g)
    old = model.lm_head.weight
    head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=True).to(old.device, old.dtype)
    head.weight.copy_(emb * g)
    head.bias.copy_(emb @ beta)
    model.lm_head = head
    cfg.tie_word_embeddings = False
    t.ln_f = rms(t.ln_f)
    for e in (t.wte, t.wpe):
        w = e.weight.double()
        e.weight.copy_(w - w.mean(-1, keepdim=True))
    return model
