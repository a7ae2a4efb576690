"""Names of the receiver-side things a write feeds: one tag type per protocol buffer.

A tag keys the receiver's counters (writes visible, writes known landed, signal
arrivals). Each type ends in a ``kind`` field of its own, so tags of two types
never compare equal even when their numbers do; they are tuples underneath,
hashed and compared at C speed on the per-packet path.
"""

from __future__ import annotations

from typing import NamedTuple


class ExpertTag(NamedTuple):
    """V1 LL: the writes of source rank ``src`` for expert ``expert`` (one count each)."""

    src: int
    expert: int
    kind: str = "expert"


class RankTag(NamedTuple):
    """V2 direct: the writes of source rank ``src`` to this rank (one barrier signal each)."""

    src: int
    kind: str = "rank"


class NotifyTag(NamedTuple):
    """The count/notify exchange: the notify write of rank ``src``."""

    src: int
    kind: str = "notify"


class TailTag(NamedTuple):
    """V2 hybrid dispatch: the slots of (source rank, channel) on the same-index GPU, whose
    tail word the forward warps poll."""

    src: int
    channel: int
    kind: str = "tail"


class ForwardTag(NamedTuple):
    """V2 hybrid dispatch: tokens of source rank ``src`` delivered to their final GPU."""

    src: int
    kind: str = "forward"


class PartialTag(NamedTuple):
    """V2 hybrid combine: partial rows of token ``token`` of source rank ``src`` at its forwarder."""

    src: int
    token: int
    kind: str = "partial"


class CombineTag(NamedTuple):
    """V2 hybrid combine: reduced rows from node ``node`` to source rank ``src``."""

    node: int
    src: int
    kind: str = "combine"


class BarrierTag(NamedTuple):
    """A closing NVLink barrier among a node's ranks: ``what`` op, flag of rank ``src``."""

    what: str
    src: int
    kind: str = "barrier"


Tag = ExpertTag | RankTag | NotifyTag | TailTag | ForwardTag | PartialTag | CombineTag | BarrierTag
