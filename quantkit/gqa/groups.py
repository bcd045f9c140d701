"""Which KV heads merge together and the query-head order that realises it (the cache's bytes:
core/roofline.py kv_bytes)."""

from __future__ import annotations

import itertools


def contiguous_groups(n_kv: int, n_groups: int) -> list[list[int]]:
    size = n_kv // n_groups
    return [list(range(g * size, (g + 1) * size)) for g in range(n_groups)]


def search_groups(n_kv: int, n_groups: int, loss, max_passes: int = 8) -> list[list[int]]:
    """Equal-sized groups with the least total `loss(group)`: pairwise swaps from the contiguous start.

    Each pass tries every swap of two heads between two groups and keeps those that lower the
    total; it stops when a pass changes nothing (a local optimum; exhaustive for 2 groups of 2).
    """
    cache: dict = {}

    def cost(group):
        key = tuple(sorted(group))
        if key not in cache:
            cache[key] = loss(key)
        return cache[key]

    groups = contiguous_groups(n_kv, n_groups)
    for _ in range(max_passes):
        improved = False
        for gi, gj in itertools.combinations(range(n_groups), 2):
            for ai, bj in itertools.product(range(len(groups[gi])), range(len(groups[gj]))):
                a, b = groups[gi][ai], groups[gj][bj]
                new_i = groups[gi][:ai] + [b] + groups[gi][ai + 1 :]
                new_j = groups[gj][:bj] + [a] + groups[gj][bj + 1 :]
                if cost(new_i) + cost(new_j) < cost(groups[gi]) + cost(groups[gj]) - 1e-12:
                    groups[gi], groups[gj] = new_i, new_j
                    improved = True
        if not improved:
            break
    return [sorted(g) for g in sorted(groups, key=min)]


def query_order(groups: list[list[int]], q_per_kv: int) -> list[int]:
    """Old query-head indices in their new order: group by group, each old KV head's queries together."""
    return [a * q_per_kv + i for g in groups for a in g for i in range(q_per_kv)]
