"""Turn the in-kernel profiler's rows into attribution shares (the attribution categories of docs/attributions.md).

Why: the model reports a *profiler* attribution (share of busy time per
category on the issuing warps); the kernels write sampled ``globaltimer``
rows into a device buffer so hw and sim compare row for row. The row format
is fixed by ``hw/ep/efa_emu.cuh`` (8 x u64):

- PUT row (kind 1), one sampled post group of the native path: ``w1`` lock ns
  (slot reservation + waiting for the doorbell turn of a shared QP: doorbells
  ring in slot order across CTAs), ``w2`` credit_wait ns (CQ polls before
  posts), ``w3`` wqe ns (64 B WQE stores), ``w4`` fence ns, ``w5`` doorbell ns,
  ``w6`` WQEs in the group (bits 31:0) and the completion reads its credit checks made
  (bits 63:32: turns of the CQ poll loop, each a read of 32 CQEs), ``w7`` total ns. Sampled one group in ``period``:
  weight = period.
- PROXY PUT row (kind 3), the same for the proxy path: ``w1`` 0, ``w2``
  credit_wait (polls of the completions the proxy wrote back), ``w3`` wqe
  (128 B descriptor stores and their publish), ``w4`` fence, ``w5`` proxy_queue
  (waiting for ring space: descriptors not yet taken by the host thread).
- PHASE row (kind 2): ``w1`` phase id, ``w2`` begin ns, ``w3`` end ns; every
  phase of every warp (weight 1).

Header word ``w0`` = kind | op << 8 | rank << 16 | warp << 32 (op 0 dispatch, 1 combine); in a
put row the warp word carries the QP the group was posted on in its bits 30:16.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PK_PUT, PK_PHASE, PK_PUT_PROXY = 1, 2, 3
PHASE_CATEGORY = {
    1: "compute",    # layout (slot/count computation)
    2: "compute",    # token packing into the send buffer
    3: "signal",     # flush: waiting for the data's send completions before signalling
    4: "signal",     # posting count/flag messages
    5: "poll_wait",  # receiver waiting for flags / receive completions
    6: "compute",    # receiver stamp checks and output
    7: "compute",    # combine reduction
    8: "drain",      # final completion drain at the end of the op
    9: "lock",       # rank barrier
    10: "forward",   # V2 forward warps storing arrived tokens into their ranks (hw/ep/v2.h)
}
PUT_FIELDS = ("lock", "credit_wait", "wqe", "fence", "doorbell")
PROXY_PUT_FIELDS = ("lock", "credit_wait", "wqe", "fence", "proxy_queue")
OPS = ("dispatch", "combine")


def decode(rows: Iterable[Sequence[int]]) -> list[dict]:
    """Rows of 8 integers -> dicts; unknown kinds are skipped (a torn row is never guessed)."""
    out = []
    for r in rows:
        w = [int(x) & 0xFFFFFFFFFFFFFFFF for x in r]
        kind, op, rank, warp = w[0] & 0xFF, (w[0] >> 8) & 0xFF, (w[0] >> 16) & 0xFFFF, w[0] >> 32
        if op > 1:
            continue
        if kind in (PK_PUT, PK_PUT_PROXY):
            fields = PUT_FIELDS if kind == PK_PUT else PROXY_PUT_FIELDS
            out.append({"kind": "put", "op": OPS[op], "rank": rank, "warp": warp & 0xFFFF,
                        "qp": (warp >> 16) & 0x7FFF, "fields": fields,
                        **dict(zip(fields, w[1:6], strict=True)), "n": w[6] & 0xFFFFFFFF,
                        "polls": w[6] >> 32, "total": w[7]})
        elif kind == PK_PHASE and w[3] >= w[2]:
            cat = PHASE_CATEGORY.get(w[1])
            if cat:
                out.append({"kind": "phase", "op": OPS[op], "rank": rank, "warp": warp,
                            "category": cat, "ns": w[3] - w[2]})
    return out


def attribution(rows: list[dict], op: str, period: int) -> tuple[dict[str, float], dict[str, float], int]:
    """(shares of all sampled busy time, shares of the put path only, put samples) for ``op``.

    Put rows are weighted by the sampling ``period``; the put path alone is what
    the campaign's profiler reported (e.g. completion-wait share 38.6% -> 0%).
    """
    if period < 1:
        raise ValueError("period must be >= 1")
    busy: dict[str, float] = {}
    put: dict[str, float] = {}
    samples = 0
    for r in rows:
        if r["op"] != op:
            continue
        if r["kind"] == "put":
            samples += 1
            for f in r.get("fields", PUT_FIELDS):
                busy[f] = busy.get(f, 0.0) + r[f] * period
                put[f] = put.get(f, 0.0) + r[f] * period
        else:
            busy[r["category"]] = busy.get(r["category"], 0.0) + r["ns"]
    return _shares(busy), _shares(put), samples


def _shares(d: dict[str, float]) -> dict[str, float]:
    tot = sum(d.values())
    if tot <= 0:
        return {}
    s = {k: round(v / tot, 6) for k, v in sorted(d.items())}
    excess = sum(s.values()) - 1.0
    if excess > 0:  # rounding must never push the sum above 1 (record schema)
        k = max(s, key=lambda x: s[x])
        s[k] = round(s[k] - excess, 6)
    return s
