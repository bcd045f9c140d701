"""Keep third-party chatter (progress bars, load reports, deprecation notes) off the user's terminal."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_libraries(debug: bool = False) -> None:
    if debug:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # library bars; quantkit draws its own (rich)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    for name in ("torch.utils._pytree", "torch._dynamo", "torch._inductor", "torchao", "datasets", "lm_eval", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
