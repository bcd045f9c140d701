"""Random but valid prompts of about L tokens, with no tokenizer download.

Common English words are one token each in the BPE vocabularies of Llama, Mistral, Qwen and
SmolLM (a leading space included), so L words make about L tokens. The length is approximate;
the run reports the server's own `usage.prompt_tokens` where the server sends it.
"""

from __future__ import annotations

import random

WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this "
    "be or has had first one their its new after who they two her she been other when there "
    "all during into school time may years more most only over city some world would where "
    "later up such used many can state about national out known university united then made "
    "these high early film than well both under area three year life called him work each "
    "between game same season part team people back john great long number group while "
    "water government through end before since being series war built river public found "
    "world music home became including house line based around small day name family take "
    "second west north south east following several against war music album band record song "
    "station town county church road light power market system field paper table window stone "
    "green black white river mountain island garden bridge train engine letter story model"
).split()


def make_words(n_tokens: int, rng: random.Random) -> str:
    """About `n_tokens` tokens of random common words ("" for 0): a shared prefix."""
    return " ".join(rng.choices(WORDS, k=n_tokens))  # one call: a per-word choice() cost 0.3 ms per prompt


def make_prompt(n_tokens: int, rng: random.Random, index: int) -> str:
    """About `n_tokens` tokens; a leading request number keeps prefix caches from sharing work
    beyond the shared prefix (workload.py), if there is one."""
    return f"Request {index}: " + make_words(max(1, n_tokens - 3), rng)
