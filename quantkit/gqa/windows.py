"""The windows GQA recovery trains and stops on, and the record of them that goes into quantkit.json.

Made from one text or the calibration samples (gqa/gqa_step.py) or from a calibration mix
(gqa/mix_windows.py); used by the distillation (gqa/recover.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Windows:
    train: list  # list of [1, seq_len] LongTensors
    heldout: list
    # Where they came from, for quantkit.json (so `eval` can refuse to score on them): source,
    # sha256 and seq_len of the text, and the token offsets of each window in its stream
    # (`train_starts` in the order training visits them); empty offsets for `self` text.
    record: dict = field(default_factory=dict)

    def describe(self, steps: int, batch_size: int) -> dict:
        """The record with the training windows actually visited in `steps` steps (they cycle)."""
        starts = self.record.get("train_starts", [])
        used = min(len(self.train), steps * batch_size)
        if "parts" in self.record:  # a calibration mix: the windows per part (gqa/mix_windows.py)
            return {
                **describe_parts(self.record, used),
                "train": len(self.train),
                "heldout": len(self.heldout),
                "train_used": used,
            }
        return {
            **self.record,
            "train": len(self.train),
            "heldout": len(self.heldout),
            "train_used": used,
            "train_starts": sorted(starts[:used]),
        }


def describe_parts(record: dict, used: int) -> dict:
    """A mix's window record for quantkit.json: per part, the training windows visited in the first `used` slots."""
    slots = record.get("slots", [])[:used]
    parts = []
    for k, r in enumerate(record["parts"]):
        starts = [a for i, a in slots if i == k]
        parts.append({**r, "train_used": len(starts), "train_starts": sorted(set(starts))})
    return {**{k: v for k, v in record.items() if k != "slots"}, "parts": parts}
