"""`quantkit eval` under torchrun: each rank scores a contiguous share of the windows and the
per-window statistics are gathered back in window order, so every figure (PPL, KL, top-1, the
bootstrap CIs, which resample whole windows with a fixed seed) is computed from exactly the
arrays one process would have built. Each window is scored alone by the same code, so the
figures equal one process's up to the kernels' own reduction order (per-window logits can differ
in the last bits between a 1-thread and a 2-thread CPU matmul).

Outside torchrun (no process group) every function here is the identity: one share, all windows.
"""

from __future__ import annotations

import torch.distributed as dist


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Windows [start, end) of `rank`: contiguous and as even as they can be (the first n % world
    ranks one more), so concatenating the ranks' shares in rank order restores window order."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def share(n: int) -> range:
    """The indices of this rank's windows, out of `n`."""
    return range(*share_bounds(n, *_world()))


def gather(items: list) -> list:
    """Every rank's per-window list, concatenated in rank (= window) order, on every rank."""
    rank, world = _world()
    if world == 1:
        return items

    parts: list = [None] * world
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def everywhere(value):
    """`value` if no rank has None (a baseline cache every rank could read), else None on every
    rank: then all of them run the pass together, and none waits for a rank that skipped it."""
    rank, world = _world()
    if world == 1:
        return value

    flags: list = [None] * world
    dist.all_gather_object(flags, value is not None)
    return value if all(flags) else None
