"""Where a model keeps what the monitor reads: its blocks, the norms that read the residual stream,
the final norm, the embedding and the output head, and each parameter's kind. `find_layout` finds
them in any model (a transformers Llama or GPT-2, normlab's own, a user's); every guess can be
named instead. `normlab_layout` is normlab's model by its names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

# the block norms of normlab's model that read the residual stream (pre, peri) or the residual sum
# x + f(x) (post); peri's output norms and per-head qk-norms are left out, so norm_in/* and
# norm/gain/* mean the same for every placement
NORMLAB_NORMS = ("attention_norm", "ffn_norm")


@dataclass
class Layout:
    """What the monitor hooks and groups. `norms[i]` maps a name (its path in block i) to a norm
    that reads block i's residual stream; `groups` maps layer_{i}, embed, head and other to
    (name, parameter) pairs; `kinds` tells matrices from gains and biases; `trunk` is every
    parameter whose gradient passes through the final norm's input; `attention` is 'sdpa' (the
    queries and keys of each F.scaled_dot_product_attention call inside a block) or 'qk' (normlab's
    `block.attention.qk(x, rope)`, recomputed from the attention's input)."""

    blocks: list[nn.Module]
    norms: list[dict[str, nn.Module]]
    final_norm: nn.Module | None
    groups: dict[str, list[tuple[str, nn.Parameter]]]
    kinds: dict[int, str]  # id(parameter) -> matrix | embedding | gain | bias
    trunk: list[nn.Parameter]
    attention: str = "sdpa"
    head: list[nn.Parameter] = field(default_factory=list)

    def describe(self) -> str:
        """One line: what was found (for a user checking the guesses)."""
        names = sorted({n for norms in self.norms for n in norms})
        final = type(self.final_norm).__name__ if self.final_norm is not None else "none"
        return (
            f"{len(self.blocks)} blocks of {type(self.blocks[0]).__name__}; residual norms "
            f"{', '.join(names) or 'none'}; final norm {final}; attention by {self.attention}"
        )


def is_norm(module: nn.Module) -> bool:
    """A normalization layer: torch's LayerNorm / RMSNorm, or any module whose class name ends in
    'Norm' (LlamaRMSNorm, T5LayerNorm, ...) or that has a normalized_shape (normlab's, DyT)."""
    return (
        isinstance(module, nn.LayerNorm | nn.RMSNorm)
        or type(module).__name__.endswith("Norm")
        or hasattr(module, "normalized_shape")
    )


def width(module: nn.Module) -> int | None:
    """The feature width a norm normalizes."""
    w = getattr(module, "weight", None)
    if isinstance(w, nn.Parameter) and w.dim() == 1:
        return w.shape[0]
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int):
        return shape
    return shape[-1] if shape else None


def is_squash(module: nn.Module) -> bool:
    """DyT (tanh(alpha x) in a norm's place): its saturated fraction is measured."""
    return hasattr(module, "alpha") and any(c.__name__ == "DyT" for c in type(module).__mro__)


def kind(module: nn.Module, pname: str, p: nn.Parameter) -> str:
    """A parameter's kind, told by the module that owns it: 'embedding', 'bias', 'gain' (a norm's
    weight, or any other vector) or 'matrix' (a Linear's or a Conv1D's weight, any 2-D or larger
    weight)."""
    if isinstance(module, nn.Embedding):
        return "embedding"
    if pname == "bias":
        return "bias"
    if is_norm(module) or p.dim() < 2:
        return "gain"
    return "matrix"


def _get(model: nn.Module, path: str, what: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ValueError(f"{what}={path!r}: the model has no such submodule") from None


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The longest ModuleList whose children are all of one class (the transformer's layers)."""
    best = None
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1:
            if best is None or len(m) > len(best):
                best = m
    if best is None:
        raise ValueError(
            "find_layout: no ModuleList of same-class blocks in the model; name them: "
            "blocks='model.layers'"
        )
    return best


def _embedding(model: nn.Module, blocks: set[int]) -> nn.Embedding | None:
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            e = get()
        except (NotImplementedError, AttributeError):
            e = None
        if isinstance(e, nn.Embedding):
            return e
    outside = [m for m in model.modules() if isinstance(m, nn.Embedding) and id(m) not in blocks]
    return max(outside, key=lambda e: e.num_embeddings, default=None)


def find_layout(
    model: nn.Module,
    blocks: str | None = None,
    norms: Sequence[str] | None = None,
    final_norm: str | None = None,
    head: str | None = None,
    attention: str = "sdpa",
) -> Layout:
    """The layout of any model. Guesses, each overridden by naming it (dotted submodule paths):
    blocks, the longest ModuleList of same-class children; norms (paths inside a block), the norms
    in each block as wide as the embedding (the residual stream's width: per-head qk-norms are
    left out); final_norm, the last such norm outside the blocks; head, a Linear outside the blocks
    as wide as the vocabulary (a head tied to the embedding is the embedding)."""
    layers = _get(model, blocks, "blocks") if blocks else _blocks(model)
    layers = list(layers)
    inside = {id(m) for b in layers for m in b.modules()}
    emb = _embedding(model, inside)
    d = emb.embedding_dim if emb is not None else None
    block_norms = []
    for i, b in enumerate(layers):
        if norms is not None:
            block_norms.append({n: _get(b, n, f"norms (block {i})") for n in norms})
            continue
        found = {n: m for n, m in b.named_modules() if n and is_norm(m) and width(m) == d}
        # a norm inside another one's scope (a wrapper's inner module) counts once
        block_norms.append(
            {n: m for n, m in found.items() if not any(n.startswith(o + ".") for o in found)}
        )
    if final_norm is not None:
        final = _get(model, final_norm, "final_norm")
    else:
        outside = [
            m
            for m in model.modules()
            if id(m) not in inside and is_norm(m) and (d is None or width(m) == d)
        ]
        final = outside[-1] if outside else None
    vocab = emb.num_embeddings if emb is not None else None
    if head is not None:
        out = _get(model, head, "head")
    else:
        linears = [
            m
            for m in model.modules()
            if isinstance(m, nn.Linear) and id(m) not in inside and m.out_features == vocab
        ]
        out = linears[-1] if linears else None
    return _layout(model, layers, block_norms, final, out, emb, attention)


def normlab_layout(model: nn.Module) -> Layout:
    """normlab's Llama (model/llama.py) by its names: the metric keys the trainer has always
    logged."""
    return find_layout(
        model,
        blocks="layers",
        norms=NORMLAB_NORMS,
        final_norm="norm",
        head="output",
        attention="qk",
    )


def auto_layout(model: nn.Module) -> Layout:
    """normlab_layout for normlab's model (its names and attention.qk), else find_layout."""
    layers = getattr(model, "layers", None)
    if (
        isinstance(layers, nn.ModuleList)
        and all(hasattr(model, n) for n in ("tok_embeddings", "output", "norm"))
        and all(hasattr(getattr(b, "attention", None), "qk") for b in layers)
    ):
        return normlab_layout(model)
    return find_layout(model)


def _layout(model, layers, block_norms, final, head, emb, attention: str) -> Layout:
    if attention not in ("sdpa", "qk"):
        raise ValueError(f"attention={attention!r}: valid: sdpa, qk")
    # id(parameter) -> kind, by the first module that owns it (a tied head is the embedding)
    owner = {}
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            owner.setdefault(id(p), kind(module, pname, p))
    in_block = {id(p): i for i, b in enumerate(layers) for p in b.parameters()}
    head_params = {id(p) for p in head.parameters()} if head is not None else set()
    emb_params = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        for p in m.parameters()
        if id(p) not in in_block
    }
    final_params = {id(p) for p in final.parameters()} if final is not None else set()
    groups: dict[str, list] = {}
    for name, p in model.named_parameters():  # a tied head is the embedding, listed once
        if id(p) in in_block:
            key = f"layer_{in_block[id(p)]}"
        elif id(p) in emb_params:
            key = "embed"
        elif id(p) in head_params:
            key = "head"
        else:
            key = "other"
        groups.setdefault(key, []).append((name, p))
    readout = head_params | final_params
    trunk = [p for _, p in model.named_parameters() if id(p) not in readout or id(p) in emb_params]
    return Layout(
        blocks=layers,
        norms=block_norms,
        final_norm=final,
        groups=groups,
        kinds=owner,
        trunk=trunk,
        attention=attention,
        head=[p for _, p in model.named_parameters() if id(p) in head_params],
    )
