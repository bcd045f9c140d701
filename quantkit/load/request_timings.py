"""One request's timings, as the client saw them: the input of every statistic in load_stats.py.

Times are `time.perf_counter()` seconds; only differences between them mean anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# Error kinds counted per step (none of them stops the run). `truncated`: the response started
# but the stream ended (closed, or the connection dropped) before [DONE] or a finish_reason.
# `stream_error`: an in-stream error object, or a chunk that breaks the protocol (not JSON, wrong
# types, data after [DONE], not an event stream). `rejected`: never sent, refused by the admission
# gate (config.Admission) because too many requests were already in flight.
ERROR_KINDS = ("http_4xx", "http_5xx", "timeout", "connection", "truncated", "stream_error", "rejected")


@dataclass
class RequestRecord:
    t_send: float
    t_end: float | None = None
    t_first: float | None = None  # first chunk that carried generated text
    chunk_times: list[float] = field(default_factory=list)  # every chunk that carried text
    output_tokens: int | None = None  # usage.completion_tokens, else the number of text chunks
    prompt_tokens: int | None = None  # usage.prompt_tokens (or llama.cpp's timings) where reported
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache
    # speculative decoding: tokens the draft model proposed, and how many of them the model kept
    # (llama.cpp's timings.draft_n / draft_n_accepted)
    draft_tokens: int | None = None
    draft_accepted: int | None = None
    # the server's own clock, where its answer carries it (llama.cpp's timings): prompt_ms from the
    # slot starting the prompt to its first token, predicted_ms from the first token to the last
    server_prompt_ms: float | None = None
    server_predicted_ms: float | None = None
    cls: str | None = None  # the workload's class of this request (long-short: "short" or "long")
    tokens_from_usage: bool = False
    finish_reason: str | None = None  # the last choice's finish_reason, as the server sent it
    done: bool = False  # the stream ended with `data: [DONE]`
    error: str | None = None  # one of ERROR_KINDS, None when the request succeeded
    status: int | None = None  # HTTP status code
    detail: str | None = None  # a short error message from the server or the transport
    client_s: float = 0.0  # time the client spent parsing and bookkeeping this request
    t_scheduled: float | None = None  # open loop: when the Poisson schedule meant to send it
    conversation: int | None = None  # which conversation, and which turn of it (workload.py)
    turn: int | None = None
    prompt_words: int | None = None  # words the client sent: about the prompt's tokens
    # The generated text, kept only where the next turn must resend it; never saved.
    text: str | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_first is not None and self.t_end is not None

    @property
    def finished(self) -> bool:
        """False for a request still in flight when the run stopped (Ctrl-C, SIGTERM, a fault)."""
        return self.t_end is not None

    def shifted(self, offset: float) -> "RequestRecord":
        """The same request with every timestamp moved by `offset` seconds."""

        def move(t: float | None) -> float | None:
            return None if t is None else t + offset

        data = self.to_dict()
        for name in ("t_send", "t_end", "t_first", "t_scheduled"):
            data[name] = move(data[name])
        data["chunk_times"] = [t + offset for t in self.chunk_times]
        return RequestRecord(**data)

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["text"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        names = {f.name for f in fields(cls)} - {"text"}
        return cls(**{k: v for k, v in data.items() if k in names})
