"""Keep third-party chatter (progress bars, load reports, deprecation notes) off the user's terminal."""

from __future__ import annotations

import logging
import os
import warnings

import tqdm.std


def quiet_libraries(debug: bool = False) -> None:
    if debug:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # library bars; quantkit draws its own (rich)
    # llm-compressor logs to stdout at import (which would corrupt --json); never set
    # LLM_COMPRESSOR_LOG_DISABLED: GPTQ then crashes on its unregistered METRIC level.
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    os.environ.setdefault("COMPRESSED_TENSORS_LOG_DISABLED", "true")
    _silence_tqdm()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger("compressed_tensors.utils.match").addFilter(_spurious_unmatched_target)
    for name in (
        "torch.utils._pytree",
        "torch.fx._symbolic_trace",
        "torch._dynamo",
        "torch._inductor",
        "torchao",
        "datasets",
        "lm_eval",
        "httpx",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


def _spurious_unmatched_target(record: logging.LogRecord) -> bool:
    """compressed-tensors 0.19's match_named_modules marks a target matched only when it is the first
    of the config's targets to match a module (it `break`s there), so loading any mixed-precision
    artifact ("Linear", then the overrides' "re:..." targets) warns "Could not match `re:...`" for
    overrides that did apply. quantkit checks at convert time that every override matches a layer
    (preflight.check_overrides_match), so for its artifacts the warning says nothing; for a
    third-party artifact it could be a real miss, which --debug shows."""
    return not record.getMessage().startswith("Could not match `")


def _silence_tqdm() -> None:
    """compressed-tensors passes disable=False to some bars explicitly, overriding TQDM_DISABLE;
    the CLI shows its own progress, so library bars are turned off at the source."""
    init = tqdm.std.tqdm.__init__
    if getattr(init, "_quantkit_quiet", False):
        return

    def quiet_init(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    quiet_init._quantkit_quiet = True
    tqdm.std.tqdm.__init__ = quiet_init
