"""A load run's settings, parsed and validated once at the edge; the engine and API registries.

Deeper code (client, runner, stats) trusts a `LoadConfig`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

from quantkit.core.option_fields import defaults
from quantkit.errors import QuantkitError
from quantkit.load.degrade import DeviceBound
from quantkit.load.load_options import DEFAULT_CONCURRENCY, LoadOptions
from quantkit.load.named_workloads import parse_named
from quantkit.load.workload import Workload, WorkloadError, build_workload


class LoadError(QuantkitError):
    """Bad `quantkit load` input, or a server that cannot be used at all."""


class ServerUnreachable(LoadError):
    """The server did not accept a connection (wrong URL, not started, firewalled)."""


@dataclass(frozen=True)
class Engine:
    """What `--engine` changes in the client: the body fields that make the server generate exactly
    max_tokens (ignore EOS), and whether a connection may carry another request after a streamed answer."""

    fields: Callable[[int], dict]
    keeps_alive: bool = True


# An engine that rejects unknown fields (transformers serve answers 422) must not get them.
ENGINES: dict[str, Engine] = {
    # Any OpenAI-compatible server: standard fields only; the output may stop early at EOS.
    "openai": Engine(lambda gen_len: {}),
    # vLLM and SGLang sampling params: https://docs.vllm.ai/en/latest/api/ (SamplingParams.ignore_eos)
    "vllm": Engine(lambda gen_len: {"ignore_eos": True}),
    "sglang": Engine(lambda gen_len: {"ignore_eos": True}),
    # llama.cpp server: `ignore_eos` is a documented /completion option and accepted on /v1/*. It
    # closes the connection after every streamed answer while announcing keep-alive (its content
    # provider's last call returns false, which cpp-httplib takes as a cancel): a request sent on
    # that connection before the close arrives fails as "Server disconnected", so each request
    # gets a connection of its own (Connection: close).
    "llamacpp": Engine(lambda gen_len: {"ignore_eos": True}, keeps_alive=False),
    # llama-cpp-python's server: no ignore_eos; `min_tokens` holds EOS back (its MinTokensLogitsProcessor).
    "llama-cpp-python": Engine(lambda gen_len: {"min_tokens": gen_len}),
    # transformers serve accepts a GenerationConfig as a JSON string; min_new_tokens holds EOS back.
    "transformers": Engine(
        lambda gen_len: {"generation_config": json.dumps({"max_new_tokens": gen_len, "min_new_tokens": gen_len})}
    ),
}

# Request path per API; the body builder lives in client.py.
APIS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


@dataclass(frozen=True)
class Slo:
    """Latency objectives in milliseconds; None means that metric has no objective."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    # the workload class whose requests the knee is judged on (long-short: `short`, the class a
    # lever such as chunked prefill is for); None: every request
    cls: str | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None


_OPTION = defaults(LoadOptions)  # what a run that was not given an option gets (load/load_options.py)


def default_workload() -> Workload:
    """The workload of load's option defaults (load/load_options.py, the one place they are written)."""
    return build_workload(_OPTION["prompt_len"], _OPTION["shared_prefix"], _OPTION["turns"], _OPTION["api"])


@dataclass(frozen=True)
class LoadConfig:
    """A run's settings: LoadOptions parsed and checked (build_config); a field of the same name
    has the option's default."""

    url: str
    model: str
    mode: str  # "concurrency" (closed loop) or "rate" (open loop, Poisson arrivals)
    levels: tuple[float, ...]
    api: str = _OPTION["api"]
    engine: str = _OPTION["engine"]
    workload: Workload = field(default_factory=default_workload)
    gen_len: int = _OPTION["gen_len"]
    step_seconds: float = _OPTION["step_seconds"]
    max_requests: int | None = _OPTION["max_requests"]
    timeout_s: float = _OPTION["timeout_s"]
    connect_timeout_s: float = 5.0
    slo: Slo = field(default_factory=Slo)
    seed: int = _OPTION["seed"]
    patience: int = _OPTION["patience"]
    stop_at_saturation: bool = not _OPTION["no_stop"]
    label: str | None = _OPTION["label"]
    extra_body: dict = field(default_factory=dict)  # fields added to every request body (lever studies)
    context_len: int | None = _OPTION["context_len"]  # the server's context in tokens, when given (else asked from it)
    headers: dict = field(default_factory=dict)  # sent with every request (a gateway's API key)
    session_header: str | None = _OPTION["session_header"]  # a header naming each request's conversation
    # search.py: the highest load that meets the SLO, by bracketing and bisection between the two
    # levels given, instead of climbing every level
    search: bool = _OPTION["search"]
    repeats: int = _OPTION["repeats"]  # steps per level (search: at the two levels around the knee), for intervals
    attribution: DeviceBound | None = None  # the device's batch-1 bound, for "TPOT degraded first"
    admission: int | None = _OPTION["admission"]  # admission gate: most requests in flight, the rest rejected at once
    class_priority: dict = field(default_factory=dict)  # request `priority` per workload class (vLLM)
    rerun_disturbed: int = _OPTION["rerun_disturbed"]  # times a step other processes disturbed is measured again
    server_pid: int | None = _OPTION["server_pid"]  # the server's process, for its cores and CPU (else found by port)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["workload"] = self.workload.to_dict()
        data["attribution"] = self.attribution.to_json() if self.attribution else None
        data["headers"] = {name: "<not recorded>" for name in self.headers}  # keys stay out of run files
        return data


def normalize_url(url: str) -> str:
    """`http://host:8000/v1/` -> `http://host:8000`: the client appends the /v1/... path itself."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise LoadError(f"URL must look like http://HOST:PORT, got {url!r}")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def parse_levels(spec: str, *, integer: bool, option: str) -> tuple[float, ...]:
    """`"1,2,4"` -> (1, 2, 4): positive, strictly increasing (a staircase only goes up)."""
    try:
        values = [float(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise LoadError(f"{option}: expected comma-separated numbers, got {spec!r}") from None
    if not values:
        raise LoadError(f"{option}: no values in {spec!r}")
    for value in values:
        if not math.isfinite(value) or value <= 0:
            raise LoadError(f"{option}: values must be positive, got {value:g}")
        if integer and value != int(value):
            raise LoadError(f"{option}: values must be whole numbers, got {value:g}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise LoadError(f"{option}: values must increase step by step, got {spec!r}")
    return tuple(int(v) if integer else v for v in values)


def parse_slo(spec: str | None) -> Slo:
    """`"ttft=500,tpot=50"` (milliseconds) -> Slo. Either key may be left out; `class=NAME` judges
    the knee on one workload class's requests."""
    if not spec:
        return Slo()
    found: dict[str, float] = {}
    cls = None
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if key == "class" and sep and value.strip():
            cls = value.strip()
            continue
        if not sep or key not in ("ttft", "tpot"):
            raise LoadError(f"--slo: expected ttft=MS,tpot=MS[,class=NAME], got {spec!r}")
        try:
            number = float(value.rstrip("ms").strip())
        except ValueError:
            raise LoadError(f"--slo: {key} must be a number of milliseconds, got {value!r}") from None
        if not math.isfinite(number) or number <= 0:
            raise LoadError(f"--slo: {key} must be positive, got {value!r}")
        found[key] = number
    if cls and not found:
        raise LoadError(f"--slo: class={cls} needs a ttft or tpot objective, got {spec!r}")
    return Slo(ttft_ms=found.get("ttft"), tpot_ms=found.get("tpot"), cls=cls)


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110, 5.6.2)


def parse_headers(specs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`("Authorization: Bearer X",)` -> {"Authorization": "Bearer X"}."""
    headers = {}
    for spec in specs:
        name, sep, value = spec.partition(":")
        if not sep or not _HEADER_NAME.match(name.strip()) or "\n" in value or "\r" in value:
            raise LoadError(f"--header: expected 'Name: value', got {spec!r}")
        headers[name.strip()] = value.strip()
    return headers


def _session_header(name: str | None) -> str | None:
    if name is not None and not _HEADER_NAME.match(name):
        raise LoadError(f"--session-header: {name!r} is not a header name")
    return name


def parse_class_priority(spec: str | None) -> dict[str, int]:
    """`"short=0,long=1"` -> {"short": 0, "long": 1}: vLLM's request `priority` per workload class
    (lower is served first under --scheduling-policy priority)."""
    if not spec:
        return {}
    out = {}
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise LoadError(f"--class-priority: expected CLASS=INT,..., got {spec!r}") from None
        if not sep or not name.strip():
            raise LoadError(f"--class-priority: expected CLASS=INT,..., got {spec!r}")
    return out


def _workload(o: LoadOptions):
    """--workload NAME, or the --prompt-len / --shared-prefix / --turns shape (not both)."""
    if not o.workload:
        return build_workload(o.prompt_len, o.shared_prefix, o.turns, o.api)
    shape = (str(o.prompt_len), o.shared_prefix, o.turns)
    if shape != (str(_OPTION["prompt_len"]), _OPTION["shared_prefix"], _OPTION["turns"]):
        raise WorkloadError("give either --workload or --prompt-len/--shared-prefix/--turns, not both")
    workload = parse_named(o.workload)
    if workload.api and workload.api != o.api:
        raise WorkloadError(f"--workload {workload.name} is a conversation of messages: use --api {workload.api}")
    return workload


def check_choice(value: str, registry: dict, option: str) -> str:
    if value not in registry:
        raise LoadError(f"{option}: unknown {value!r}; choose one of {', '.join(sorted(registry))}")
    return value


def build_config(
    o: LoadOptions,
    *,
    url: str,
    model: str,
    attribution: DeviceBound | None = None,
    extra_body: dict | None = None,
) -> LoadConfig:
    """The options as given -> a LoadConfig, or one LoadError naming the offending option. The
    attribution is `o.attribution` read by the caller (a study expands its path first)."""
    if o.concurrency and o.rate:
        raise LoadError("give either --concurrency (closed loop) or --rate (open loop), not both")
    if o.rate:
        mode, levels = "rate", parse_levels(o.rate, integer=False, option="--rate")
    else:
        spec = o.concurrency or DEFAULT_CONCURRENCY
        mode, levels = "concurrency", parse_levels(spec, integer=True, option="--concurrency")
    _check(o, levels)
    api = check_choice(o.api, APIS, "--api")
    return LoadConfig(
        url=normalize_url(url),
        model=model,
        mode=mode,
        levels=levels,
        api=api,
        engine=check_choice(o.engine, ENGINES, "--engine"),
        workload=_workload(o),
        class_priority=parse_class_priority(o.class_priority),
        repeats=o.repeats,
        search=o.search,
        admission=o.admission,
        rerun_disturbed=o.rerun_disturbed,
        gen_len=o.gen_len,
        context_len=o.context_len,
        headers=parse_headers(o.headers),
        session_header=_session_header(o.session_header),
        step_seconds=o.step_seconds,
        max_requests=o.max_requests,
        timeout_s=o.timeout_s,
        slo=parse_slo(o.slo),
        seed=o.seed,
        patience=o.patience,
        stop_at_saturation=not o.no_stop,
        label=o.label,
        extra_body=extra_body or {},
        attribution=attribution,
        server_pid=o.server_pid,
    )


def _check(o: LoadOptions, levels: tuple[float, ...]) -> None:
    """The options' bounds and combinations, each refused in one line naming its flag."""
    for option, value in (
        ("--gen-len", o.gen_len),
        ("--step-seconds", o.step_seconds),
        ("--timeout", o.timeout_s),
        ("--max-requests", o.max_requests),
        ("--context-len", o.context_len),
    ):
        if value is not None and not value > 0:
            raise LoadError(f"{option} must be positive, got {value:g}")
    if o.patience < 1:
        raise LoadError(f"--patience must be at least 1, got {o.patience}")
    if o.repeats < 1:
        raise LoadError(f"--repeats must be at least 1, got {o.repeats}")
    if o.admission is not None and o.admission < 1:
        raise LoadError(f"--admission must be at least 1 request in flight, got {o.admission}")
    if o.admission is not None and not o.rate:
        # a closed loop never has more in flight than its concurrency: a gate below it would only
        # turn workers into a loop of rejections
        raise LoadError("--admission gates arrivals: use it with --rate (open loop)")
    if o.rerun_disturbed < 0:
        raise LoadError(f"--rerun-disturbed must be 0 or more, got {o.rerun_disturbed}")
    if o.search:
        if len(levels) != 2:
            raise LoadError("--search takes the two bounds of the load to search between, e.g. --concurrency 1,16")
        if not o.slo:
            raise LoadError("--search finds the highest load that meets the SLO: give --slo")
