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


def make_inputs(shape: Shape, seed: int = 0, exact: bool = False) -> list[dict[str, Any]]:
    """Per rank: FP8 tokens (as uint8 bytes), scales, distinct top-k experts, weights.

    ``exact``: weights k/8 (k in 1..8) instead of uniform floats, so that with
    :func:`make_expert_outputs` ``exact`` every partial sum of a combine is exact in
    float32 and in BF16 (V2 reduces on the node, then at the source: any order, any
    rounding of partials gives V1's result bit for bit)."""
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
        if exact:
            w = torch.randint(1, 9, (shape.tokens, shape.top_k), generator=g).float() / 8.0
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


def make_expert_outputs(shape: Shape, layouts: list[dict[str, Any]], seed: int = 1,
                        exact: bool = False) -> list[Any]:
    """Per rank: BF16 expert outputs [E_local, R, T, H] (random where a token landed, 0 elsewhere).

    ``exact``: small integers in [-4, 4], so that a weighted sum of top_k <= 8 of them with
    weights k/8 is a multiple of 1/8 of magnitude <= 32: exact in BF16 (8 significant bits)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for lay in layouts:
        y = torch.zeros(shape.experts_per_rank, shape.num_ranks, shape.tokens, shape.hidden,
                        dtype=torch.bfloat16)
        valid = torch.arange(shape.tokens)[None, None, :] < lay["counts"][:, :, None]
        n = int(valid.sum())
        if exact:
            y[valid] = torch.randint(-4, 5, (n, shape.hidden), generator=g).to(torch.bfloat16)
        else:
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


# ----------------------------------------------------------------- DeepEP V2 (hybrid, direct)
# V2 delivers a token once per destination RANK (not per expert): rank d holds, per source
# s, the tokens of s with any expert on d, in token order (slot = rank of the token among
# them). Combine sends one row per received token back: the rank's experts' weighted sum
# (what DeepEP's combine takes as input, the MoE layer's output on that rank), reduced on
# the node by the forwarder (hybrid) and at the source. With ``exact`` inputs the final
# output is V1's :func:`combine` bit for bit, which is what the V2 gate compares with.


def rank_layout(shape: Shape, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per destination rank: counts [R] and source token indices [R, T] (-1 past the count)."""
    import torch

    R, T, El = shape.num_ranks, shape.tokens, shape.experts_per_rank
    res = []
    for dest in range(R):
        counts = torch.zeros(R, dtype=torch.int32)
        src = torch.full((R, T), -1, dtype=torch.int32)
        for s in range(R):
            on = (inputs[s]["topk"].long() // El == dest).any(dim=1).nonzero().flatten()
            counts[s] = on.numel()
            src[s, : on.numel()] = on.to(torch.int32)
        res.append({"counts": counts, "src": src})
    return res


def rank_payload(shape: Shape, inputs: list[dict[str, Any]], layout: dict[str, Any]) -> tuple[Any, Any]:
    """The FP8 bytes [R, T, H] and scales [R, T, H/128] a rank holds (zero past the counts)."""
    import torch

    R, T = shape.num_ranks, shape.tokens
    x = torch.zeros(R, T, shape.hidden, dtype=torch.uint8)
    sc = torch.zeros(R, T, shape.scales, dtype=torch.float32)
    for s in range(R):
        n = int(layout["counts"][s])
        idx = layout["src"][s, :n].long()
        x[s, :n] = inputs[s]["x_fp8"][idx]
        sc[s, :n] = inputs[s]["scales"][idx]
    return x, sc


def expert_view(shape: Shape, inputs: list[dict[str, Any]], dest: int, src: Any, counts: Any
                ) -> dict[str, Any]:
    """V1's per-(expert, source) layout of rank ``dest`` derived from its V2 buffer (``src``
    [R, T] token indices, ``counts`` [R]): what makes V2's dispatch output V1's."""
    import torch

    R, T, El = shape.num_ranks, shape.tokens, shape.experts_per_rank
    out_c = torch.zeros(El, R, dtype=torch.int32)
    out_s = torch.full((El, R, T), -1, dtype=torch.int32)
    for s in range(R):
        toks = src[s, : int(counts[s])].long()
        topk = inputs[s]["topk"].long()[toks]  # [n, K]
        for le in range(El):
            hit = toks[(topk == dest * El + le).any(dim=1)]
            out_c[le, s] = hit.numel()
            out_s[le, s, : hit.numel()] = hit.to(torch.int32)
    return {"counts": out_c, "src": out_s}


def rank_rows(shape: Shape, inputs: list[dict[str, Any]], layouts: list[dict[str, Any]],
              expert_out: list[Any], rlayouts: list[dict[str, Any]]) -> list[Any]:
    """Per rank d: its combine input rows [R, T, H] BF16 at its V2 buffer positions: for the
    token t at (s, j), sum over the top-k slots k of t whose expert is on d, in k order, of
    w[t, k] * y(expert_k, t), float32, rounded once to BF16."""
    import torch

    R, T, El, H = shape.num_ranks, shape.tokens, shape.experts_per_rank, shape.hidden
    out = []
    for d in range(R):
        rows = torch.zeros(R, T, H, dtype=torch.bfloat16)
        for s in range(R):
            topk = inputs[s]["topk"].long()
            w = inputs[s]["topk_w"]
            for j in range(int(rlayouts[d]["counts"][s])):
                t = int(rlayouts[d]["src"][s, j])
                acc = torch.zeros(H, dtype=torch.float32)
                for k in range(shape.top_k):
                    dest, le = divmod(int(topk[t, k]), El)
                    if dest != d:
                        continue
                    slot = int((layouts[d]["src"][le, s] == t).nonzero()[0, 0])
                    acc = acc + w[t, k] * expert_out[d][le, s, slot].float()
                rows[s, j] = acc.to(torch.bfloat16)
        out.append(rows)
    return out


def combine_v2(shape: Shape, inputs: list[dict[str, Any]], rows: list[Any], rlayouts: list[dict[str, Any]],
               ranks_per_node: int, hybrid: bool) -> list[Any]:
    """Per source rank: BF16 [T, H] the way the V2 kernels reduce: hybrid, the rows of a remote
    node's expert ranks summed at the forwarder (float32, local-rank order, one BF16 rounding),
    then at the source the node rows and the own node's rows in rank order (float32, one
    rounding); direct, the expert ranks' rows in rank order at the source."""
    import torch

    R, T, El, H, P = shape.num_ranks, shape.tokens, shape.experts_per_rank, shape.hidden, ranks_per_node

    def row(d: int, s: int, t: int) -> Any:
        j = int((rlayouts[d]["src"][s] == t).nonzero()[0, 0])
        return rows[d][s, j].float()

    res = []
    for s in range(R):
        ns = s // P
        out = torch.zeros(T, H, dtype=torch.bfloat16)
        for t in range(T):
            dests = sorted({int(e) // El for e in inputs[s]["topk"][t].tolist()})
            contrib: dict[int, Any] = {}
            for d in dests:
                if not hybrid or d // P == ns:
                    contrib[d] = row(d, s, t)
            if hybrid:
                for m in sorted({d // P for d in dests} - {ns}):
                    acc = torch.zeros(H, dtype=torch.float32)
                    for d in dests:
                        if d // P == m:
                            acc = acc + row(d, s, t)
                    contrib[m * P + s % P] = acc.to(torch.bfloat16).float()
            acc = torch.zeros(H, dtype=torch.float32)
            for r in sorted(contrib):
                acc = acc + contrib[r]
            out[t] = acc.to(torch.bfloat16)
        res.append(out)
    return res
