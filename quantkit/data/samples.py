"""Calibration samples: seeded windows cut from a token stream, optionally in the chat template.

One text (data/calib.py) and each text part of a mix (data/mix.py) choose their windows here, so
both choose them the same way for the same seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from quantkit.errors import DataError


@dataclass
class CalibrationSet:
    samples: list  # list of 1 x seq_len LongTensors
    manifest: dict


def duplicate_fraction(samples) -> float:
    """Fraction of samples whose token sequence already appeared earlier in the set."""
    seen: set[bytes] = set()
    dups = 0
    for s in samples:
        key = hashlib.sha1(s.numpy().tobytes()).digest()
        dups += key in seen
        seen.add(key)
    return dups / max(1, len(samples))


def seeded_windows(spans: list[tuple[int, int]], n: int, seed: int) -> list[tuple[int, int]]:
    """n of the [start, end) spans, picked by a permutation seeded with `seed`, in stream order."""

    order = torch.randperm(len(spans), generator=torch.Generator().manual_seed(seed)).tolist()[:n]
    return sorted(spans[i] for i in order)


def window_batch(tokenizer, stream, chosen: list[tuple[int, int]], seq_len: int, chat_template: bool) -> list:
    """The chosen windows as 1 x seq_len tensors; with `chat_template`, each decoded and re-rendered
    as an assistant turn (cut to seq_len; a turn that comes out shorter is dropped)."""
    batch = [stream[s:e].unsqueeze(0) for s, e in chosen]
    if chat_template:
        batch = chat_wrap(tokenizer, [tokenizer.decode(b[0]) for b in batch], seq_len)
    return batch


def chat_wrap(tokenizer, windows_text: list[str], seq_len: int) -> list:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("calibration.chat_template: the model's tokenizer has no chat template")
    out = []
    for text in windows_text:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Continue the text."}, {"role": "assistant", "content": text}],
            tokenize=True,
            return_dict=False,
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)[:seq_len]
        if len(ids) < seq_len:
            continue
        out.append(torch.tensor([ids], dtype=torch.long))
    return out
