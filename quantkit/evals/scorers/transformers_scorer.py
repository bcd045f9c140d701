"""The transformers scorer: a checkpoint as a user loads it (quantization config honoured), on the
CPU or a GPU. It also makes every baseline pass (scorers.BASELINE), and its loaded model is the
one lm-eval tasks reuse.

A baseline pass keeps, per position, the input of the model's output layer (`hidden`: hidden size
floats, not vocabulary size) where that layer alone reproduces the model's logits from it
(OutputHead.reproduces, checked on the first window). The exact KL then recomputes the
baseline's whole-vocabulary rows from them with its output layer (a matmul per position, not
a forward pass), a chunk of positions at a time, beside the model under test.

An artifact with an FP8 KV cache scheme is scored with it: transformers' load rounds K and V to
FP8 with the checkpoint's scales at every attention's cache update (models/kv_scheme.py), what
vLLM's FP8 cache holds; `--kv-cache f16` switches that rounding off (the same weights, a 16-bit
cache), so the cache's own cost is the difference of two scores.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.evals.accuracy_stats import KL_CHUNK, TOPK, window_reference
from quantkit.evals.placement import default_batch_size
from quantkit.evals.scorers.scorer import Scorer, ScorerSettings
from quantkit.models import kv_scheme
from quantkit.models.checkpoint import load_model

# How close the output layer's own logits must be to the forward pass's: float32 differs by
# summation order only; 16-bit matmuls round each logit to 8 bits of mantissa (2^-8 ~ 0.4%).
REPRODUCE_TOLERANCE = {torch.float32: 1e-5}
REPRODUCE_TOLERANCE_16BIT = 1e-2


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
    exact_kl = True
    planned = True
    kv_caches = ("f16",)  # the checkpoint's FP8 K/V rounding off; by default it is on where the checkpoint has it

    def __init__(self, model, batch_size: int = 1, kv_cache: str | None = None):
        self.model, self.batch_size, self.kv_cache = model, max(1, int(batch_size)), kv_cache

    @classmethod
    def open(cls, source: Path, settings: ScorerSettings) -> "TransformersScorer":
        model = load(source, settings)
        facts = kv_scheme.of_checkpoint(source)
        if facts is not None and settings.kv_cache == "f16":
            kv_scheme.set_rounding(model, False)
        kv = None if facts is None else "16-bit" if settings.kv_cache else facts.label
        # sized after the load: what is left of the device's memory is what a batch may take
        bs = settings.batch_size or default_batch_size(
            settings.device, model.config.to_dict(), settings.seq_len, settings.n_windows, settings.dtype
        )
        return cls(model, bs, kv)

    def _forward(self, windows: list, hidden: bool = False):
        """Per window: its logits rows (seq_len - 1, vocab) and, with `hidden`, its output layer's
        input rows (seq_len - 1, hidden size)."""
        head = self.model.get_output_embeddings() if hidden else None
        seen: list = []
        hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0])) if head is not None else None
        try:
            for b in range(0, len(windows), self.batch_size):
                ids = torch.stack(list(windows[b : b + self.batch_size])).to(self.model.device)
                seen.clear()
                with torch.inference_mode():
                    logits = self.model(input_ids=ids, use_cache=False).logits[:, :-1]
                    inputs = seen[-1][:, :-1] if seen else [None] * len(logits)
                    yield from zip(logits, inputs)
        finally:
            if hook is not None:
                hook.remove()

    def logps(self, windows: list):
        for row, _ in self._forward(windows):
            with torch.inference_mode():
                yield torch.log_softmax(row.float(), dim=-1)

    def reference(self, windows: list, k: int | None = None):
        """stats.window_reference per window, with `hidden` (the output layer's inputs, on the CPU in
        the model's dtype) where the output layer reproduces the logits from them."""
        head, exact = self.head(), None
        for ids, (row, h) in zip(windows, self._forward(windows, hidden=True)):
            if exact is None:
                exact = h is not None and head.reproduces(h, row)
            with torch.inference_mode():
                logp = torch.log_softmax(row.float(), dim=-1)
                ref = window_reference(logp, ids[1:].to(logp.device), k or TOPK)
            if exact:
                ref["hidden"] = h.detach().to("cpu", copy=True)
            yield ref

    def head(self) -> "OutputHead":
        return OutputHead.of(self.model)

    def describe(self) -> dict:
        kv = {"kv_cache_type": self.kv_cache} if self.kv_cache else {}
        return {"engine": self.name, "batch_size": self.batch_size, **kv}

    def close(self) -> None:
        self.model = None


class OutputHead:
    """A model's output layer alone (its lm_head, the tied embedding where tied, and the final
    logit soft-capping of the architectures that have one): the model's logits from the output
    layer's inputs. It keeps only that layer's weights alive once the model is dropped."""

    def __init__(self, module, softcap: float | None):
        self.module, self.softcap = module, softcap
        self.weight = next(module.parameters())

    @classmethod
    def of(cls, model) -> "OutputHead":
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return cls(model.get_output_embeddings(), getattr(config, "final_logit_softcapping", None))

    def logits(self, hidden):
        with torch.inference_mode():
            x = self.module(hidden.to(self.weight.device, self.weight.dtype))
            if self.softcap:
                x = torch.tanh(x / self.softcap) * self.softcap
            return x

    def reproduces(self, hidden, logits) -> bool:
        """The logits from `hidden` match the forward pass's `logits` to the dtype's rounding (an
        architecture that scales or caps its logits in a way this class does not know: False).
        Compared KL_CHUNK positions at a time: the whole window's comparison held five more
        vocabulary-sized float32 arrays beside its logits (11.4 GB at a 262,144 vocabulary and 2,048
        positions, against 7.3 GB for the rest of the evaluation)."""
        if hidden.shape[:-1] != logits.shape[:-1]:
            return False
        tol = REPRODUCE_TOLERANCE.get(self.weight.dtype, REPRODUCE_TOLERANCE_16BIT)
        for lo in range(0, logits.shape[0], KL_CHUNK):
            got = self.logits(hidden[lo : lo + KL_CHUNK]).float()
            want = logits[lo : lo + KL_CHUNK].float().to(self.weight.device)
            if got.shape != want.shape or not bool(((got - want).abs() <= tol * (1.0 + want.abs())).all()):
                return False
        return True

    def rows(self, hidden):
        """`base_rows` for stats.kl_exact: (lo, hi) -> float32 log-probabilities of rows lo..hi-1."""

        def rows(lo: int, hi: int):
            with torch.inference_mode():
                return torch.log_softmax(self.logits(hidden[lo:hi]).float(), dim=-1)

        return rows
