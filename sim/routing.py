"""Top-k routing of tokens to experts: seeded uniform, or read from a file.

Experts are laid out contiguously and spread as evenly as they can be: with E
experts on R ranks, the first ``E mod R`` ranks host ``ceil(E / R)`` and the
rest ``floor(E / R)`` (EP24 with 256 experts: 16 ranks of 11, 8 of 10), so
``experts_per_rank`` shows the split and ``rank_of`` is a table lookup. The routing is drawn per seed (not per op) so dispatch and
combine of one seed see the same tokens.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from lever.sim.params import Scenario

if TYPE_CHECKING:
    from lever.sim.params import Design


_CACHE_SIZE = 8
_CACHE: dict[tuple, Routing] = {}
"""Uniform routings drawn in this process, keyed by everything the draw reads, least recently
used first. A routing is read-only once made (its rows and the tables derived from them), so
runs can share one: the draw and its top-k selection were a tenth of an EP16 op's
instructions, and its derived tables (``hits``, ``dst_ranks``) are then built once too."""


class Routing:
    """``topk[r]`` is an int array (tokens_per_rank, top_k) of expert ids, each row in the order
    the router gives them (descending score, as ``torch.topk`` returns them): the order a
    token's writes are issued in. Sorting rows by expert id would send every token's first
    write to the lowest-numbered rank, a bias no real router has."""

    def __init__(self, topk: list[np.ndarray], num_experts: int, ranks_per_node: int) -> None:
        self.topk = topk
        self.R = len(topk)
        self.num_experts = num_experts
        base, extra = divmod(num_experts, self.R)
        self.first = [r * base + min(r, extra) for r in range(self.R + 1)]
        self.experts_per_rank = [self.first[r + 1] - self.first[r] for r in range(self.R)]
        self._owner = np.repeat(np.arange(self.R), self.experts_per_rank)
        self._owner_list = self._owner.tolist()
        self.rpn = ranks_per_node

    @classmethod
    def for_scenario(cls, scn: Scenario, seed: int) -> Routing:
        """The routing of ``scn``'s workload for run seed ``seed``: drawn once per process for
        the same draw (:data:`_CACHE`), as dispatch and combine of one seed, a calibration's
        runs of one record and a lever's baseline and variant all draw it again."""
        wl = scn.workload
        if wl.routing == "file":
            return cls._drawn(scn, seed)
        key = (scn.seed, seed, wl.routing_seed_offset, wl.ep_ranks, wl.tokens_per_rank,
               wl.num_experts, wl.top_k, wl.ranks_per_node)
        rt = _CACHE.pop(key, None)
        if rt is None:
            rt = cls._drawn(scn, seed)
        _CACHE[key] = rt  # the most recently used last
        while len(_CACHE) > _CACHE_SIZE:
            del _CACHE[next(iter(_CACHE))]
        return rt

    @classmethod
    def _drawn(cls, scn: Scenario, seed: int) -> Routing:
        wl = scn.workload
        if wl.routing == "file":
            data = json.loads(Path(wl.routing_file).read_text())
            topk = [np.asarray(t, dtype=np.int64) for t in data["topk"]]
            if len(topk) != wl.ep_ranks or any(t.shape != (wl.tokens_per_rank, wl.top_k) for t in topk):
                raise ValueError(f"{wl.routing_file}: topk shape does not match the workload")
            return cls(topk, wl.num_experts, wl.ranks_per_node)
        rng = np.random.default_rng([scn.seed, seed, 7919 + wl.routing_seed_offset])
        topk = []
        # one rank's keys at a time: the same stream, drawn in the same order as one
        # (ranks, tokens, experts) array, and each row's top-k is its own; an EP256 draw of
        # the whole array touched 200 MB of fresh pages (a third of a second, mostly faults)
        for _ in range(wl.ep_ranks):
            keys = rng.random((wl.tokens_per_rank, wl.num_experts))
            idx = np.argpartition(keys, wl.top_k, axis=1)[:, : wl.top_k]
            # score order: the smallest key is the highest score
            order = np.argsort(np.take_along_axis(keys, idx, axis=1), axis=1, kind="stable")
            topk.append(np.take_along_axis(idx, order, axis=1))
        return cls(topk, wl.num_experts, wl.ranks_per_node)

    def rank_of(self, expert: int) -> int:
        return self._owner_list[expert]

    def experts_of(self, rank: int) -> range:
        """The experts rank ``rank`` hosts (contiguous)."""
        return range(self.first[rank], self.first[rank + 1])

    @cached_property
    def hits(self) -> list[list[Counter[int]]]:
        """Per source rank, per token: how many of its experts each destination rank hosts."""
        return [[Counter(row) for row in self._owner[t].tolist()] for t in self.topk]

    @cached_property
    def dst_ranks(self) -> list[list[tuple[int, ...]]]:
        """Per source rank, per token: the distinct ranks hosting its experts."""
        return [[tuple(sorted(h)) for h in rows] for rows in self.hits]

    @cached_property
    def dst_nodes(self) -> list[list[tuple[int, ...]]]:
        return [[tuple(sorted({r // self.rpn for r in row})) for row in d] for d in self.dst_ranks]

    def max_puts_per_qp(self, d: Design) -> int:
        """An upper bound of WQEs one QP carries in one call (all on one QP, plus signals)."""
        R = self.R
        T = self.topk[0].shape[0]
        if d.protocol == "v1-ll":
            per = T * self.topk[0].shape[1] + self.num_experts
        elif d.protocol == "v2-direct":
            per = T * R + R
        else:
            nodes = max(1, R // self.rpn)
            per = T * nodes + (T // d.scaleout_update_interval + 2) * nodes
        return per
