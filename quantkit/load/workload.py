"""The workload's shape: prompt lengths, a shared prefix, multi-turn conversations (tokenizer-free, seeded).

`--prompt-len` syntax (lengths in tokens, approximate: one common word is one token):

    128                   every prompt 128 tokens
    64:256                uniform over 64..256 (inclusive)
    256,long=0.1x4        90% at 256, 10% at 4x that (1024): a long-prompt fraction
    64:256,long=0.05x8    the two combined: 5% of the drawn lengths are 8x longer

`--shared-prefix N` puts the same N-token prefix (a system prompt) before every prompt; the prompt
length is the unique part after it. `--turns K` makes K-turn conversations: each request resends
the conversation so far (prefix, earlier user turns, the server's own answers) plus a new user turn.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import asdict, dataclass

from quantkit.errors import QuantkitError
from quantkit.load.prompts import make_prompt, make_words

_LENGTH = re.compile(r"^(\d+)(?::(\d+))?$")
_LONG = re.compile(r"^long=([0-9.]+)x([0-9.]+)$")
SYNTAX = "N, LO:HI, optionally followed by ,long=FRACTIONxFACTOR (e.g. 256,long=0.1x4)"
# Chat templates add a few tokens per message (role markers); used only for the context check.
TEMPLATE_TOKENS_PER_MESSAGE = 8


class WorkloadError(QuantkitError):
    """A workload that cannot be built or cannot fit the server."""


@dataclass(frozen=True)
class LengthSpec:
    low: int
    high: int
    long_fraction: float = 0.0
    long_factor: float = 1.0

    @property
    def longest(self) -> int:
        return round(self.high * self.long_factor) if self.long_fraction else self.high

    def draw(self, rng: random.Random) -> int:
        n = self.low if self.low == self.high else rng.randint(self.low, self.high)
        if self.long_fraction and rng.random() < self.long_fraction:
            n = round(n * self.long_factor)
        return n

    def describe(self) -> str:
        text = f"{self.low}" if self.low == self.high else f"{self.low}:{self.high}"
        return text + (f",long={self.long_fraction:g}x{self.long_factor:g}" if self.long_fraction else "")


def parse_prompt_len(spec: str | int) -> LengthSpec:
    """The --prompt-len syntax above -> LengthSpec, or one WorkloadError naming what is wrong."""
    text = str(spec).replace(" ", "")
    base, comma, rest = text.partition(",")
    match = _LENGTH.match(base)
    if not match or (comma and not rest):
        raise WorkloadError(f"--prompt-len {spec!r}: expected {SYNTAX}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if low < 1 or high < low:
        raise WorkloadError(f"--prompt-len {spec!r}: lengths must be >= 1 and LO <= HI")
    if not rest:
        return LengthSpec(low, high)
    long = _LONG.match(rest)
    if not long:
        raise WorkloadError(f"--prompt-len {spec!r}: expected {SYNTAX}")
    try:
        fraction, factor = float(long.group(1)), float(long.group(2))
    except ValueError:
        raise WorkloadError(f"--prompt-len {spec!r}: long=FRACTIONxFACTOR takes two numbers") from None
    if not 0 < fraction <= 1:
        raise WorkloadError(f"--prompt-len {spec!r}: the long fraction must be in (0, 1], got {fraction:g}")
    if not factor > 1:
        raise WorkloadError(f"--prompt-len {spec!r}: the long factor must be above 1, got {factor:g}")
    return LengthSpec(low, high, fraction, factor)


@dataclass(frozen=True)
class Workload:
    """Random common words of the lengths --prompt-len gives (named_workloads.py: the built-in named
    workloads). No defaults here: they are load's options' (load/load_options.py), built by build_workload."""

    prompt_len: LengthSpec
    shared_prefix: int
    turns: int
    name = "synthetic"
    api = None  # either API (turns above 1 need chat: build_workload)
    body = {}  # request-body fields the workload needs (named_workloads.Copy: greedy decoding)

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name, "prompt_len_spec": self.prompt_len.describe()}

    def source(self, seed: int) -> "RequestSource":
        return RequestSource(self, seed)

    def longest_prompt(self, gen_len: int) -> int:
        """About how many tokens the longest request's prompt has (the last turn of a conversation
        of longest turns): an estimate for the context check, words counted as tokens."""
        messages = 2 * self.turns + (1 if self.shared_prefix else 0)
        return (
            self.shared_prefix
            + self.turns * self.prompt_len.longest
            + (self.turns - 1) * gen_len
            + TEMPLATE_TOKENS_PER_MESSAGE * messages
        )


def build_workload(prompt_len: str | int, shared_prefix: int, turns: int, api: str) -> Workload:
    """The --prompt-len / --shared-prefix / --turns shape, checked."""
    if shared_prefix < 0:
        raise WorkloadError(f"--shared-prefix must be 0 or more tokens, got {shared_prefix}")
    if turns < 1:
        raise WorkloadError(f"--turns must be at least 1, got {turns}")
    if turns > 1 and api != "chat":
        raise WorkloadError("--turns above 1 resends a conversation: use --api chat")
    return Workload(parse_prompt_len(prompt_len), shared_prefix, turns)


def check_fits(workload, gen_len: int, context: int | None, source: str | None) -> None:
    """Refuse a workload that cannot fit the server's context (when the context is known)."""
    if not context:
        return
    where = f"the server's context ({context} tokens, {source})"
    longest = workload.longest_prompt(gen_len)
    if not isinstance(workload, Workload):
        if longest + gen_len > context:
            raise WorkloadError(
                f"the longest request of --workload {workload.describe()} (about {longest} prompt tokens) "
                f"plus --gen-len {gen_len} does not fit {where}"
            )
        return
    if workload.shared_prefix >= context:
        raise WorkloadError(f"--shared-prefix {workload.shared_prefix} is longer than {where}")
    if longest + gen_len > context:
        raise WorkloadError(
            f"the longest request (about {longest} prompt tokens: prefix {workload.shared_prefix}, "
            f"{workload.turns} turn(s) of up to {workload.prompt_len.longest}, the answers in between) "
            f"plus --gen-len {gen_len} does not fit {where}"
        )


@dataclass
class Conversation:
    index: int
    messages: list[dict]
    turns: int = 0


@dataclass
class Turn:
    """One request of the workload: what to send, and which conversation and turn it is."""

    conversation: Conversation
    messages: list[dict]
    turn: int
    words: int  # words the client sent (about the prompt's tokens, before a chat template)
    cls: str | None = None  # the workload's class of this request (long-short: short or long)


class RequestSource:
    """Requests of the workload, reproducible from the seed.

    Conversations wait in a FIFO queue between turns: the next request continues the oldest idle
    conversation, or starts a new one when every open conversation has a request in flight. A
    conversation ends after `turns` answers, or at its first failed turn."""

    def __init__(self, workload: Workload, seed: int):
        self.workload = workload
        self._rng = random.Random(seed)
        self._seed = seed
        prefix = make_words(workload.shared_prefix, random.Random(f"{seed}:prefix"))
        self._prefix = [{"role": "system", "content": prefix}] if prefix else []
        self._idle: deque[Conversation] = deque()
        self._requests = 0
        self._conversations = 0

    @property
    def keep_text(self) -> bool:
        return self.workload.turns > 1

    def next(self) -> Turn:
        if self._idle:
            conv = self._idle.popleft()
        else:
            self._conversations += 1
            conv = Conversation(self._conversations, list(self._prefix))
        self._requests += 1
        prompt = make_prompt(self.workload.prompt_len.draw(self._rng), self._rng, self._requests)
        conv.messages.append({"role": "user", "content": prompt})
        conv.turns += 1
        words = sum(len(m["content"].split()) for m in conv.messages)
        return Turn(conv, list(conv.messages), conv.turns, words)

    def warm_up(self) -> list[dict]:
        """A first turn with the same shared prefix, outside the seeded sequence of requests."""
        prompt = make_prompt(self.workload.prompt_len.low, random.Random(f"{self._seed}:warm-up"), 0)
        return [*self._prefix, {"role": "user", "content": prompt}]

    def answered(self, turn: Turn, ok: bool, text: str | None) -> None:
        """Put the conversation back for its next turn, with the server's answer, or end it."""
        conv = turn.conversation
        if ok and conv.turns < self.workload.turns:
            conv.messages.append({"role": "assistant", "content": text or ""})
            self._idle.append(conv)
