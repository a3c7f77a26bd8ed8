"""The Llama decoder: tok_embeddings -> blocks -> final norm (pre / peri only) -> output head."""

from __future__ import annotations

import torch
from torch import nn

from model.args import EMBED_SCALES, ModelArgs, lookup
from model.blocks import BLOCKS, build_block, model_norm
from model.layers import softcap
from model.norms import _Norm
from model.ops import OPS_IMPLS
from model.rope import rope_tables


def parameter_kinds(model: nn.Module) -> dict[str, str]:
    """Each named parameter's kind, told by the module that owns it (never by its shape): 'matrix'
    (a Linear's weight), 'embedding', 'gain' (a norm's weight, or the embedding's scalar) or 'bias'.
    Tied weights are listed once, under their first name."""
    owner = {}
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if isinstance(module, nn.Embedding):
                kind = "embedding"
            elif pname == "bias":
                kind = "bias"
            elif isinstance(module, nn.Linear):
                kind = "matrix"
            elif isinstance(module, (_Norm, nn.LayerNorm, nn.RMSNorm)) or hasattr(
                module, "normalized_shape"
            ):
                kind = "gain"
            # a scalar gain on the embedding
            elif isinstance(module, Llama) and pname == "embed_scale":
                kind = "gain"
            else:
                raise TypeError(f"parameter_kinds: no rule for {type(module).__name__}.{pname}")
            owner.setdefault(id(p), kind)  # a tied head is the embedding: first owner wins
    return {name: owner[id(p)] for name, p in model.named_parameters()}


class Llama(nn.Module):
    """A LLaMA-style decoder whose norm and norm placement are chosen by name in ModelArgs."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args.check()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(build_block(args, i) for i in range(args.n_layers))
        final = args.norm if lookup(BLOCKS, args.placement, "placement").final_norm else "none"
        self.norm = model_norm(args, "final", final)
        scale = lookup(EMBED_SCALES, args.embed_scale, "embed_scale")(args.dim)
        # a learnable scalar times the embedding (DyT's LLaMA recipe: init sqrt(dim)), else none
        # 1-D for FSDP2
        self.embed_scale = None if scale is None else nn.Parameter(torch.full((1,), float(scale)))
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.cross_entropy = lookup(OPS_IMPLS, args.ops_impl, "ops_impl").cross_entropy
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        # derived from args: not in checkpoints
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def _apply(self, fn, recurse: bool = True):
        """Casts and moves the module as usual, but the RoPE tables stay float32 (recomputed on the
        new device): a bfloat16 model rotates q and k with float32 angles, as LLaMA does."""
        super()._apply(fn, recurse)
        cos, sin = rope_tables(
            self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, self.rope_cos.device
        )
        self.rope_cos, self.rope_sin = cos, sin
        return self

    def reset_parameters(self) -> None:
        """The embedding ~ N(init_embedding_mean, embedding_std^2) (a mean != 0 shifts every token's
        features by the same amount: the mean LayerNorm removes and RMSNorm keeps), the output head
        ~ N(0, head_std^2); each block initializes its own parameters with matrix_std
        (Block.reset_parameters); the final norm resets itself. The stds are ModelArgs' (init_std,
        or c / sqrt(dim) under init_scale=width; init_embedding_std and init_head_std when given).
        The order of random draws (embedding, blocks in order, head, then any attention gates)
        makes models that differ only in their norm, placement or gate start from identical
        weights."""
        a = self.args
        nn.init.normal_(self.tok_embeddings.weight, a.init_embedding_mean, a.embedding_std)
        for layer in self.layers:
            layer.reset_parameters(a.matrix_std, a.n_layers, a.init_residual)
        if hasattr(self.norm, "reset_parameters"):
            self.norm.reset_parameters()
        if self.embed_scale is not None:
            nn.init.constant_(self.embed_scale, EMBED_SCALES[self.args.embed_scale](self.args.dim))
        if not self.args.tie_embeddings:
            nn.init.normal_(self.output.weight, 0.0, a.head_std)
        for layer in self.layers:  # attention gates last: the other weights as without them
            gate = layer.attention.w_gate
            if gate is not None:
                nn.init.normal_(gate.weight, 0.0, a.matrix_std)
                if gate.bias is not None:
                    nn.init.zeros_(gate.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) for token ids idx (B, T), soft-capped when model.logit_softcap > 0
        (float32 then), and the mean cross-entropy of those logits when targets are given (targets
        == -1 are ignored)."""
        T = idx.shape[1]
        if T > self.args.max_seq_len:
            raise ValueError(
                f"sequence length {T} exceeds model.max_seq_len={self.args.max_seq_len}"
            )
        rope = (self.rope_cos[:T], self.rope_sin[:T])
        h = self.tok_embeddings(idx)
        if self.args.zero_mean_writers:  # the embedding writes the stream too: centre its rows
            h = h - h.mean(-1, keepdim=True)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        for layer in self.layers:
            h = layer(h, rope)
        logits = self.output(self.norm(h))
        # cap tanh(logits / cap) in float32 (float64 stays), before the loss and z-loss
        if self.args.logit_softcap:
            logits = softcap(
                logits.to(torch.promote_types(logits.dtype, torch.float32)), self.args.logit_softcap
            )
        loss = None
        if targets is not None:
            loss = self.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy decoding."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.args.max_seq_len :])[0][:, -1, :].float()
            if temperature <= 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters (tied weights counted once); non_embedding: without the token
        embedding and an untied output head (Kaplan et al. 2020's N, the blocks and norms)."""
        n = sum(p.numel() for p in self.parameters())
        if not non_embedding:
            return n
        head = 0 if self.output.weight is self.tok_embeddings.weight else self.output.weight.numel()
        return n - self.tok_embeddings.weight.numel() - head
