"""The transformers scorer: a checkpoint as a user loads it (quantization config honoured), on the
CPU or a GPU. It also makes every baseline pass (scorers.BASELINE), and its loaded model is the
one lm-eval tasks reuse."""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.evals.placement import default_batch_size
from quantkit.evals.scorers.base import Scorer, ScorerSettings
from quantkit.models.checkpoint import load_model


def load(source: Path, settings: ScorerSettings):
    """The transformers model of a checkpoint, as eval loads every one (the baseline, the model
    under test, the generator of `self` text, lm-eval's)."""
    return load_model(
        source, dtype=settings.dtype, device=settings.device, trust_remote_code=settings.trust_remote_code
    )


class TransformersScorer(Scorer):
    """`batch_size` windows per forward pass (on a GPU a batch keeps the device busy; windows are
    all seq_len long, so no padding and no mask). Each window's rows are upcast to float32 one
    window at a time, so only one window's float32 logits exist beside the batch's own."""

    name = "transformers"
    takes_checkpoint = True
    devices = ("cpu", "cuda")
    scores_baseline = True
    runs_tasks = True
    planned = True

    def __init__(self, model, batch_size: int = 1):
        self.model, self.batch_size = model, max(1, int(batch_size))

    @classmethod
    def open(cls, source: Path, settings: ScorerSettings) -> "TransformersScorer":
        model = load(source, settings)
        # sized after the load: what is left of the device's memory is what a batch may take
        bs = settings.batch_size or default_batch_size(
            settings.device, model.config.to_dict(), settings.seq_len, settings.n_windows, settings.dtype
        )
        return cls(model, bs)

    def logps(self, windows: list):
        for b in range(0, len(windows), self.batch_size):
            ids = torch.stack(list(windows[b : b + self.batch_size])).to(self.model.device)
            with torch.inference_mode():
                logits = self.model(input_ids=ids, use_cache=False).logits[:, :-1]
                for row in logits:
                    yield torch.log_softmax(row.float(), dim=-1)

    def describe(self) -> dict:
        return {"engine": self.name, "batch_size": self.batch_size}

    def close(self) -> None:
        self.model = None
