"""The built-in named workloads: each exercises one lever, from the real text quantkit ships.

    agent       multi-turn sessions: a long system prompt (tool documentation from the Python
                Language Reference, then worked examples) shared by every session; each turn
                appends the previous answer and a tool's output (a World Factbook entry), so the
                reusable prefix grows turn by turn. The lever: prefix caching.
    long-short  most prompts short, a fraction FACTOR times longer (passages to summarize); every
                statistic also per class ("short", "long"). The levers: chunked prefill, priority
                for short prompts, admission control.
    copy        answers that repeat spans of the prompt (repeat a passage word for word, return it
                with its typos fixed, quote it): prompt-lookup (n-gram) speculation can be accepted.

`--workload NAME[:KEY=VALUE,...]` (e.g. `long-short:short=64,factor=16,fraction=0.1`). Lengths are
in tokens, approximate: a passage of N tokens is N / TOKENS_PER_WORD words of its text; the run
records the server's own count. Texts: `set:world-factbook` (public domain),
`set:python-reference` (PSF License), read as every other shipped text is (sha256 checked).
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import asdict, dataclass, fields
from functools import cache

from quantkit.data.text import parse_spec, read_text
from quantkit.load.workload import TEMPLATE_TOKENS_PER_MESSAGE, Conversation, Turn, WorkloadError

# Tokens per whitespace-separated word of each text (punctuation and subwords included), measured
# with the demo's tokenizer (SmolLM2) on the first 200 kB of each; Llama's and Qwen's are close.
TOKENS_PER_WORD = {"world-factbook": 1.48, "python-reference": 1.67}


@cache
def _text(name: str) -> str:
    return read_text(parse_spec(f"set:{name}")).text


@cache
def factbook() -> tuple[tuple[str, str], ...]:
    """(country, its notes) per World Factbook entry: a title block, then its paragraphs."""
    entries: list[tuple[str, list[str]]] = []
    for block in (b.strip() for b in _text("world-factbook").split("\n\n")):
        if not block:
            continue
        if len(block.split()) <= 4 and not block.endswith("."):
            entries.append((block, []))
        elif entries:
            entries[-1][1].append(block)
    return tuple((name, " ".join(notes)) for name, notes in entries if notes)


def _words(text: str, tokens: int, rng: random.Random, per_word: float = TOKENS_PER_WORD["world-factbook"]) -> str:
    """About `tokens` tokens of `text`, starting at a sentence start picked by `rng`."""
    words = text.split()
    n = max(1, round(tokens / per_word))
    starts = [i + 1 for i, w in enumerate(words[: max(1, len(words) - n)]) if w.endswith(".")] or [0]
    start = rng.choice(starts)
    return " ".join(words[start : start + n])


def _passage(tokens: int, rng: random.Random) -> str:
    """About `tokens` tokens of one Factbook entry (entries joined when one is too short)."""
    entries = factbook()
    text = ""
    while len(text.split()) * TOKENS_PER_WORD["world-factbook"] < tokens * 1.2:
        text += " " + entries[rng.randrange(len(entries))][1]
    return _words(text, tokens, rng)


class _Source:
    """What the runner asks a workload for (as workload.RequestSource): the next request, a warm-up,
    and the answer of each request (a multi-turn workload resends it)."""

    keep_text = False

    def __init__(self, seed: int):
        self._rng = random.Random(seed)
        self._seed = seed
        self._requests = 0

    def answered(self, turn: Turn, ok: bool, text: str | None) -> None:
        pass


class _Named:
    """What every named workload answers besides its own source: its spec and its JSON form."""

    def describe(self) -> str:
        return f"{self.name}:" + ",".join(f"{k}={v:g}" for k, v in asdict(self).items())

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self), "spec": self.describe()}


# ---------------------------------------------------------------- agent

_SYSTEM = (
    "You are an assistant that answers questions about countries. You can call a lookup tool; "
    "its output is given to you after the word TOOL. Answer in two or three sentences, using only "
    "the tool's output and the conversation so far.\n\nReference notes for tool authors:\n{docs}\n\n"
    "Worked examples:\n{shots}"
)
_ASK = (
    "What does the tool say about {country}'s history?",
    "How does {country} compare with the country before it?",
    "Summarize the economy of {country} from the tool output.",
    "Which facts about {country} stand out?",
)


@dataclass(frozen=True)
class Agent(_Named):
    """Sessions of `turns` turns after a `system`-token prompt with `shots` worked examples; each
    turn adds a tool output of `tool` tokens."""

    system: int = 768
    shots: int = 2
    tool: int = 128
    turns: int = 4
    name = "agent"
    api = "chat"  # a conversation of messages
    body = {}

    def longest_prompt(self, gen_len: int) -> int:
        per_turn = self.tool + 24 + TEMPLATE_TOKENS_PER_MESSAGE
        shots = self.shots * (self.tool + 24 + 3 * 60)
        return self.system + shots + self.turns * per_turn + (self.turns - 1) * (gen_len + TEMPLATE_TOKENS_PER_MESSAGE)

    def source(self, seed: int) -> "_AgentSource":
        return _AgentSource(self, seed)


class _AgentSource(_Source):
    keep_text = True

    def __init__(self, spec: Agent, seed: int):
        super().__init__(seed)
        self.spec = spec
        fixed = random.Random(f"{seed}:agent-system")  # one system prompt for every session
        docs = _words(_text("python-reference"), spec.system, fixed, TOKENS_PER_WORD["python-reference"])
        shots = []
        for i in range(spec.shots):
            country, notes = factbook()[fixed.randrange(len(factbook()))]
            shots.append(
                f"Example {i + 1}.\nUSER: {_ASK[i % len(_ASK)].format(country=country)}\n"
                f"TOOL: {_words(notes, spec.tool, fixed)}\nASSISTANT: {_words(notes, 60, fixed)}"
            )
        self._system = [{"role": "system", "content": _SYSTEM.format(docs=docs, shots="\n\n".join(shots))}]
        self._idle: deque[Conversation] = deque()
        self._sessions = 0

    def _turn_message(self, turn: int) -> dict:
        country, notes = factbook()[self._rng.randrange(len(factbook()))]
        question = _ASK[(turn - 1) % len(_ASK)].format(country=country)
        return {"role": "user", "content": f"{question}\nTOOL: {_words(notes, self.spec.tool, self._rng)}"}

    def next(self) -> Turn:
        if self._idle:
            conv = self._idle.popleft()
        else:
            self._sessions += 1
            conv = Conversation(self._sessions, list(self._system))
        self._requests += 1
        conv.turns += 1
        conv.messages.append(self._turn_message(conv.turns))
        return Turn(conv, list(conv.messages), conv.turns, sum(len(m["content"].split()) for m in conv.messages))

    def warm_up(self) -> list[dict]:
        return [*self._system, {"role": "user", "content": "Which tools can you call?"}]

    def answered(self, turn: Turn, ok: bool, text: str | None) -> None:
        conv = turn.conversation
        if ok and conv.turns < self.spec.turns:
            conv.messages.append({"role": "assistant", "content": text or ""})
            self._idle.append(conv)


# ---------------------------------------------------------------- long-short


@dataclass(frozen=True)
class LongShort(_Named):
    """Passages to summarize: `short` tokens, a `fraction` of them `factor` times longer."""

    short: int = 64
    factor: int = 16
    fraction: float = 0.1
    name = "long-short"
    api = None  # either API
    body = {}

    def longest_prompt(self, gen_len: int) -> int:
        return self.short * self.factor + 32 + TEMPLATE_TOKENS_PER_MESSAGE

    def source(self, seed: int) -> "_LongShortSource":
        return _LongShortSource(self, seed)


class _LongShortSource(_Source):
    def __init__(self, spec: LongShort, seed: int):
        super().__init__(seed)
        self.spec = spec

    def _request(self, cls: str, rng: random.Random, index: int) -> list[dict]:
        tokens = self.spec.short * (self.spec.factor if cls == "long" else 1)
        text = f"Request {index}. Summarize the following text in one sentence.\n\n{_passage(tokens, rng)}"
        return [{"role": "user", "content": text}]

    def next(self) -> Turn:
        self._requests += 1
        cls = "long" if self._rng.random() < self.spec.fraction else "short"
        messages = self._request(cls, self._rng, self._requests)
        conv = Conversation(self._requests, messages, turns=1)
        return Turn(conv, messages, 1, len(messages[0]["content"].split()), cls=cls)

    def warm_up(self) -> list[dict]:
        return self._request("short", random.Random(f"{self._seed}:warm-up"), 0)


# ---------------------------------------------------------------- copy

_COPY_TASKS = (
    "Repeat the following passage exactly, word for word.\n\n{passage}",
    "Fix the spelling mistakes in the following passage and return the whole passage.\n\n{passage}",
    "Quote the following passage in full, without changing a word.\n\n{passage}",
)


def _typos(text: str, rng: random.Random, rate: float = 0.03) -> str:
    """Swap two inner letters of about `rate` of the words: a passage to return corrected."""
    words = text.split()
    for i, word in enumerate(words):
        if len(word) > 4 and word.isalpha() and rng.random() < rate:
            j = rng.randrange(1, len(word) - 2)
            words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2 :]
    return " ".join(words)


@dataclass(frozen=True)
class Copy(_Named):
    """Tasks whose answer is a `passage`-token span of the prompt."""

    passage: int = 128
    name = "copy"
    api = None
    # greedy decoding: the answer is the passage, token for token, so drafts taken from the prompt
    # are accepted for a reason (a sampled answer strays from it)
    body = {"temperature": 0}

    def longest_prompt(self, gen_len: int) -> int:
        return round(1.25 * self.passage) + 32 + TEMPLATE_TOKENS_PER_MESSAGE  # typos tokenize longer

    def source(self, seed: int) -> "_CopySource":
        return _CopySource(self, seed)


class _CopySource(_Source):
    def __init__(self, spec: Copy, seed: int):
        super().__init__(seed)
        self.spec = spec

    def _request(self, rng: random.Random) -> list[dict]:
        task = rng.randrange(len(_COPY_TASKS))
        passage = _passage(self.spec.passage, rng)
        if task == 1:
            passage = _typos(passage, rng)
        return [{"role": "user", "content": _COPY_TASKS[task].format(passage=passage)}]

    def next(self) -> Turn:
        self._requests += 1
        messages = self._request(self._rng)
        conv = Conversation(self._requests, messages, turns=1)
        return Turn(conv, messages, 1, len(messages[0]["content"].split()))

    def warm_up(self) -> list[dict]:
        return self._request(random.Random(f"{self._seed}:warm-up"))


# ---------------------------------------------------------------- the registry

NAMED: dict[str, type] = {"agent": Agent, "long-short": LongShort, "copy": Copy}
_SPEC = re.compile(r"^([a-z-]+)(?::(.*))?$")


def parse_named(spec: str) -> Agent | LongShort | Copy:
    """`NAME[:KEY=VALUE,...]` -> the named workload, or one WorkloadError naming what is wrong."""
    match = _SPEC.match(spec.strip())
    if not match or match.group(1) not in NAMED:
        raise WorkloadError(f"--workload {spec!r}: unknown; choose one of {', '.join(NAMED)} (NAME[:KEY=VALUE,...])")
    cls = NAMED[match.group(1)]
    known = {f.name: f.type for f in fields(cls)}
    values: dict = {}
    for part in filter(None, (match.group(2) or "").split(",")):
        key, sep, text = part.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise WorkloadError(f"--workload {spec!r}: {match.group(1)} takes {', '.join(known)} (KEY=VALUE)")
        try:
            value = float(text) if known[key] == "float" else int(text)
        except ValueError:
            raise WorkloadError(f"--workload {spec!r}: {key} must be a number, got {text!r}") from None
        values[key] = value
    workload = cls(**values)
    _check(workload, spec)
    return workload


def _check(workload, spec: str) -> None:
    for f in fields(workload):
        value = getattr(workload, f.name)
        if f.name == "fraction":
            if not 0 < value < 1:
                raise WorkloadError(f"--workload {spec!r}: fraction must be between 0 and 1, got {value:g}")
        elif f.name == "factor":
            if value < 2:
                raise WorkloadError(f"--workload {spec!r}: factor must be 2 or more, got {value}")
        elif value < (0 if f.name == "shots" else 1):
            raise WorkloadError(f"--workload {spec!r}: {f.name} must be positive, got {value}")
