"""The interface every eval scorer implements; the runner (evals/eval_runner.py) is shared by all.

A scorer is one module holding one `Scorer` subclass, registered by its `--engine` name in
`scorers/__init__.py` (`SCORERS`). The runner only calls what is below, in this order, and
decides by the class attributes, never by a scorer's name:

    Scorer.check(source, device)            # before anything loads: library, device, the file itself
    Scorer.auto_device(device)              # what --device auto means for this scorer
    scorer = Scorer.open(source, settings)  # the model under test (or the baseline), loaded
    scorer.reference(windows)               # the baseline pass: per window top-k, NLL, argmax
    scorer.compare(windows, references)     # per window and token: NLL, KL (top-k + tail), agreement
    scorer.describe(); scorer.model; scorer.close()

`windows` are 1-D LongTensors of seq_len token ids, tokenized by the baseline's tokenizer, so
every scorer sees exactly the same tokens. `reference` and `compare` are built on `logps` (full
next-token log-probabilities); a scorer whose library reports only some log-probabilities per
position overrides `compare` (and leaves `scores_baseline` False). Libraries (torch, numpy, the
engine's own) are imported when a model is checked or opened: the CLI lists the scorers and reads
their capabilities without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.evals.accuracy_stats import TOPK, window_reference, window_stats


@dataclass(frozen=True)
class ScorerSettings:
    """What a scorer needs to open a model. `device` is a resolved `torch.device`."""

    device: Any
    dtype: str  # the precision a checkpoint loads in (evals/placement.py)
    seq_len: int  # tokens per window: a scorer with a fixed context sizes it to this
    n_windows: int = 1  # the most windows one text holds (bounds a batch)
    batch_size: int | None = None  # windows per forward pass; None: the scorer's own choice
    trust_remote_code: bool = False
    kv_cache: str | None = None  # EvalSettings.kv_cache: the KV cache the model is scored with; None: its own
    flash_attn: bool | None = None  # llama.cpp's flash attention; None: its default for the cache


class Scorer:
    """Log-probabilities of a model over token windows, behind the few calls the runner makes.

    Class attributes (capabilities) a scorer sets:
      name               registry name, the `--engine` value ("transformers", "llamacpp")
      takes_checkpoint   scores a checkpoint directory (16-bit, or a quantkit artifact)
      takes_gguf         scores a GGUF file (its identity is then read from the GGUF: evals/gguf.py)
      exports_on_the_fly a checkpoint directory is exported exactly to GGUF, then scored
      devices            device types it can run on ("cpu", "cuda"); check() refuses what this
                         machine's build cannot do
      scores_baseline    it can make the baseline pass (full log-probabilities of a checkpoint);
                         the baseline's scorer is scorers.BASELINE
      runs_tasks         lm-eval tasks may run beside it (on the checkpoint it scores)
      exact_kl           its rows are the whole vocabulary's, so compare() gives the exact KL when
                         the baseline's rows come with the references (`base_rows`); else the
                         KL is the top-k bound whatever is asked (and --kl exact is refused)
      planned            `eval --plan`'s cost model (a transformers forward per window) is its cost
      kv_caches          the --kv-cache values it scores with ("any": every llama.cpp cache type; a
                         tuple: those; empty: none, the model's cache as its engine holds it)
      flash_attn_lever   it has a flash-attention setting (--flash-attn)
    Instance attribute:
      model              the loaded transformers model lm-eval tasks may reuse, else None
    """

    name = "?"
    takes_checkpoint = True
    takes_gguf = False
    exports_on_the_fly = False
    devices: tuple[str, ...] = ("cpu",)
    scores_baseline = False
    runs_tasks = False
    exact_kl = False
    planned = False
    kv_caches: tuple[str, ...] | str = ()
    flash_attn_lever = False
    model: Any = None

    @classmethod
    def check(cls, source: Path, device) -> None:
        """Before any weights load: raise QuantkitError (one line) when this scorer cannot score
        `source` on `device` (library missing, a device its build cannot use, an unreadable file)."""

    @classmethod
    def auto_device(cls, device):
        """The device `--device auto` means for this scorer, given the one auto resolved to."""
        return device

    @classmethod
    def open(cls, source: Path, settings: ScorerSettings) -> "Scorer":
        """Load `source` on `settings.device`, ready to score windows."""
        raise NotImplementedError

    def logps(self, windows: list) -> Iterator:
        """Per window, in order: float32 (seq_len - 1, vocab) log-probabilities of each next token
        (row i is the distribution of token i + 1), on any device."""
        raise NotImplementedError

    def reference(self, windows: list, k: int | None = None) -> Iterator[dict]:
        """Per window, the baseline's record: stats.window_reference (top-k, NLL, argmax; k: stats.TOPK)."""

        for ids, logp in zip(windows, self.logps(windows)):
            yield window_reference(logp, ids[1:].to(logp.device), k or TOPK)

    def compare(self, windows: list, references) -> Iterator[dict]:
        """Per window, its tokens' statistics against the baseline's record: stats.window_stats
        ({"nll", "kl", "agree"} numpy arrays of seq_len - 1; the KL exact where the record carries
        the baseline's whole rows, `base_rows`)."""

        for ids, logp, ref in zip(windows, self.logps(windows), references):
            yield window_stats(logp, ids[1:].to(logp.device), ref)

    def describe(self) -> dict:
        """{"engine": name, ...}: what scored, for the result's `scorer` key."""
        return {"engine": self.name}

    def close(self) -> None:
        """Free the model (the runner may load the next one in the same process)."""
