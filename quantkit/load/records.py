"""One request's timings, as the client saw them: the input of every statistic in stats.py.

Times are `time.perf_counter()` seconds; only differences between them mean anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# Error kinds counted per step (none of them stops the run).
ERROR_KINDS = ("http_4xx", "http_5xx", "timeout", "connection", "stream_error")


@dataclass
class RequestRecord:
    t_send: float
    t_end: float | None = None
    t_first: float | None = None  # first chunk that carried generated text
    chunk_times: list[float] = field(default_factory=list)  # every chunk that carried text
    output_tokens: int | None = None  # usage.completion_tokens, else the number of text chunks
    prompt_tokens: int | None = None  # usage.prompt_tokens where the server reports it
    tokens_from_usage: bool = False
    error: str | None = None  # one of ERROR_KINDS, None when the request succeeded
    status: int | None = None  # HTTP status code
    detail: str | None = None  # a short error message from the server or the transport
    client_s: float = 0.0  # time the client spent parsing and bookkeeping this request
    t_scheduled: float | None = None  # open loop: when the Poisson schedule meant to send it

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_first is not None and self.t_end is not None

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
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
