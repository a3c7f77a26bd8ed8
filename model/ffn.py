"""The feed-forwards: LLaMA's SwiGLU and its ablations (ReLU, GELU, squared ReLU), FFNS."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.args import ModelArgs, lookup
from model.layers import writer
from model.ops import OPS_IMPLS


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)   (Shazeer, 2020)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        hidden = args.ffn_hidden_dim
        self.w1 = nn.Linear(args.dim, hidden, bias=args.linear_bias)
        self.w2 = writer(args, hidden, args.dim)
        self.w3 = nn.Linear(args.dim, hidden, bias=args.linear_bias)
        # silu(a) * b, maybe fused
        self.swiglu = lookup(OPS_IMPLS, args.ops_impl, "ops_impl").swiglu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.swiglu(self.w1(x), self.w3(x)))


class ReluFeedForward(nn.Module):
    """w2(relu(w1 x)): the original Transformer's feed-forward (Vaswani et al. 2017), the one Xiong
    et al. (2020) analyse. Degree-1 homogeneous where SwiGLU is degree 2, which changes how
    gradients flow through Post-LN at init (lab/analyses/init_grads.py). Same hidden width as
    SwiGLU's; there is no w3."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden_dim, bias=args.linear_bias)
        self.w2 = writer(args, args.ffn_hidden_dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.relu(self.w1(x)))


class GeluFeedForward(ReluFeedForward):
    """w2(gelu(w1 x)), gelu(a) = a * Phi(a) with Phi the standard normal CDF (exact erf form;
    Hendrycks & Gimpel 2016; BERT / GPT-2). Smooth and degree-1 homogeneous for large |a|, as ReLU:
    an ablation of the SwiGLU-vs-ReLU argument (lab/analyses/init_grads.py). ReLU's parameters
    (w1, w2) and init."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Relu2FeedForward(ReluFeedForward):
    """w2(relu(w1 x)^2): squared ReLU (So et al. 2021, Primer). Degree-2 homogeneous as SwiGLU,
    without its gate: separates the degree from the gating in the SwiGLU-vs-ReLU argument
    (lab/analyses/init_grads.py). ReLU's parameters (w1, w2) and init."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.relu(self.w1(x)).square())


FFNS: dict[str, type[nn.Module]] = {
    "swiglu": FeedForward,
    "relu": ReluFeedForward,
    "gelu": GeluFeedForward,
    "relu2": Relu2FeedForward,
}
