"""Selection and confirmation: the two parts of an evaluation text, cut by token position.

A recipe, a method or a layer picked as the best on some windows and then reported on those same
windows carries a figure biased in its favour: among close candidates, the one picked is often the
one whose noise on those windows happened to help. So the eval region (the first half of each text
by default) is cut in two: choices (recipes, sensitivity rankings, method comparisons) are made on
`selection`, the first half of the region, and figures are reported on `confirmation`, the second
half, which no choice saw. `all` is the whole region, as before the parts existed.
"""

from __future__ import annotations

from quantkit.errors import DataError
from quantkit.recipe.eval_options import REGIONS, SPLITS


def region_range(n_tokens: int, region: str) -> tuple[int, int]:
    """[lo, hi) of a text's region; the same cut as data.text.region_windows."""
    if region == "first-half":
        return 0, n_tokens // 2
    if region == "second-half":
        return n_tokens // 2, n_tokens
    if region == "all":
        return 0, n_tokens
    raise DataError(f"unknown region {region!r}; use one of {', '.join(REGIONS)}")


def split_range(n_tokens: int, region: str, split: str) -> tuple[int, int]:
    """[lo, hi) of the part `split` of the region: the region itself, its first half or its second."""
    lo, hi = region_range(n_tokens, region)
    mid = lo + (hi - lo) // 2
    if split == "all":
        return lo, hi
    if split == "selection":
        return lo, mid
    if split == "confirmation":
        return mid, hi
    raise DataError(f"--split {split}: use one of {', '.join(SPLITS)}")


def split_windows(n_tokens: int, seq_len: int, region: str, split: str) -> list[tuple[int, int]]:
    """Non-overlapping [start, end) windows of seq_len tokens lying wholly inside the part, from its start."""
    lo, hi = split_range(n_tokens, region, split)
    return [(s, s + seq_len) for s in range(lo, hi - seq_len + 1, seq_len)]


def where(region: str, split: str) -> str:
    """The part in words: 'the first half' or 'the selection part of the first half'."""
    place = "the text" if region == "all" else f"the {region.replace('-', ' ')} of the text"
    return place if split == "all" else f"the {split} part of {place}"


def shortfall(got: int, wanted: int, seq_len: int, region: str, split: str, span: tuple[int, int]) -> str | None:
    """One sentence when a part yields fewer windows than were asked for (None when it yields them all)."""
    if got >= wanted:
        return None
    lo, hi = span
    return (
        f"{got} of the {wanted} windows asked for: {where(region, split)} (tokens {lo:,} to {hi:,}) holds only "
        f"{got} windows of {seq_len} tokens"
    )
