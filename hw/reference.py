"""Pure-PyTorch reference of the low-latency dispatch and combine (the gate's truth).

Why a separate module: the correctness gate compares the kernels' outputs with
``torch.equal`` against these functions, so they must be simple, CPU-testable
and define the exact layout and arithmetic the kernels promise:

- dispatch: every (token, expert) pair is one message; expert ``e`` on rank
  ``e // E_local`` receives, per source rank, the tokens routed to it **in token
  order** (slot = rank of the token among that source's tokens for ``e``). The
  outputs per rank are ``counts[E_local, R]``, ``src[E_local, R, T]`` (token
  index, -1 past the count), and the FP8 payload and scales at those slots.
- combine: expert outputs (BF16) travel back; ``out[t] = sum_k w[t, k] *
  y(expert_k, t)`` accumulated in float32 in k order with separate multiply and
  add (no FMA), rounded once to BF16 - exactly what the kernel does.

torch is imported lazily so importing ``hw`` stays cheap on machines without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Shape:
    """The decode shape of one run."""

    num_ranks: int
    tokens: int = 128
    hidden: int = 7168
    top_k: int = 8
    num_experts: int = 256

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.num_ranks

    @property
    def scales(self) -> int:
        return self.hidden // 128

    def check(self) -> None:
        """Refuse shapes the kernels do not support, with the reason."""
        if self.num_experts % self.num_ranks:
            raise ValueError(f"num_experts ({self.num_experts}) must be a multiple of ranks ({self.num_ranks})")
        if self.hidden % 128:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of 128 (FP8 scale groups)")
        if not 1 <= self.top_k <= 8 or self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be in 1..8 and <= num_experts")
        if self.num_ranks > 32:
            raise ValueError("at most 32 ranks (one lane per source rank in the receivers)")


def make_inputs(shape: Shape, seed: int = 0) -> list[dict[str, Any]]:
    """Per rank: FP8 tokens (as uint8 bytes), scales, distinct top-k experts, weights."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _r in range(shape.num_ranks):
        x = torch.randn(shape.tokens, shape.hidden, generator=g) * 2.0
        x_fp8 = x.to(torch.float8_e4m3fn).view(torch.uint8)
        scales = torch.rand(shape.tokens, shape.scales, generator=g) + 0.5
        scores = torch.rand(shape.tokens, shape.num_experts, generator=g)
        topk = scores.topk(shape.top_k, dim=1).indices.to(torch.int32)
        w = torch.rand(shape.tokens, shape.top_k, generator=g)
        out.append({"x_fp8": x_fp8.contiguous(), "scales": scales.contiguous(),
                    "topk": topk.contiguous(), "topk_w": w.contiguous()})
    return out


def dispatch_layout(shape: Shape, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per destination rank: counts [E_local, R] and source token indices [E_local, R, T]."""
    import torch

    R, T, El = shape.num_ranks, shape.tokens, shape.experts_per_rank
    res = []
    for dest in range(R):
        counts = torch.zeros(El, R, dtype=torch.int32)
        src = torch.full((El, R, T), -1, dtype=torch.int32)
        for s in range(R):
            topk = inputs[s]["topk"].long()
            for le in range(El):
                ge = dest * El + le
                toks = (topk == ge).any(dim=1).nonzero().flatten()
                counts[le, s] = toks.numel()
                src[le, s, : toks.numel()] = toks.to(torch.int32)
        res.append({"counts": counts, "src": src})
    return res


def dispatch_payload(shape: Shape, inputs: list[dict[str, Any]], layout: dict[str, Any]
                     ) -> tuple[Any, Any]:
    """The FP8 bytes [E_local, R, T, H] and scales [E_local, R, T, H/128] a rank must hold.

    Slots past the count are zero; the gate compares only the slots below the count.
    """
    import torch

    El, R, T = shape.experts_per_rank, shape.num_ranks, shape.tokens
    x = torch.zeros(El, R, T, shape.hidden, dtype=torch.uint8)
    sc = torch.zeros(El, R, T, shape.scales, dtype=torch.float32)
    for s in range(R):
        for le in range(El):
            n = int(layout["counts"][le, s])
            idx = layout["src"][le, s, :n].long()
            x[le, s, :n] = inputs[s]["x_fp8"][idx]
            sc[le, s, :n] = inputs[s]["scales"][idx]
    return x, sc


def make_expert_outputs(shape: Shape, layouts: list[dict[str, Any]], seed: int = 1) -> list[Any]:
    """Per rank: BF16 expert outputs [E_local, R, T, H] (random where a token landed, 0 elsewhere)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for lay in layouts:
        y = torch.zeros(shape.experts_per_rank, shape.num_ranks, shape.tokens, shape.hidden,
                        dtype=torch.bfloat16)
        valid = torch.arange(shape.tokens)[None, None, :] < lay["counts"][:, :, None]
        n = int(valid.sum())
        y[valid] = torch.randn(n, shape.hidden, generator=g).to(torch.bfloat16)
        out.append(y)
    return out


def combine(shape: Shape, inputs: list[dict[str, Any]], layouts: list[dict[str, Any]],
            expert_out: list[Any]) -> list[Any]:
    """Per source rank: BF16 [T, H] = sum_k w[t,k] * y(topk[t,k], t) in float32, k order, no FMA."""
    import torch

    El, T = shape.experts_per_rank, shape.tokens
    res = []
    for s in range(shape.num_ranks):
        topk = inputs[s]["topk"].long()
        w = inputs[s]["topk_w"]
        acc = torch.zeros(T, shape.hidden, dtype=torch.float32)
        for k in range(shape.top_k):
            rows = torch.empty(T, shape.hidden, dtype=torch.bfloat16)
            for t in range(T):
                ge = int(topk[t, k])
                dest, le = divmod(ge, El)
                src = layouts[dest]["src"][le, s]
                slot = int((src == t).nonzero()[0, 0])
                rows[t] = expert_out[dest][le, s, slot]
            prod = w[:, k : k + 1] * rows.float()
            acc = acc + prod
        res.append(acc.to(torch.bfloat16))
    return res
