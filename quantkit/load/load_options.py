"""What a load run is asked for, as options: each field's name, type, default and help, once.

`quantkit load`'s options (cli/_options.py) and a lever study's `load:` section (load/study.py,
through recipe/section_fields.py) are both made from these fields; load/config.py's build_config
turns them, checked, into the LoadConfig a run uses (levels, workload, SLO parsed). A study's
section differs from the command where it declares so (study.py STUDY_LOAD_DEFAULTS; a key
spelled otherwise is the option's `key`).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.core.option_fields import FLAG, MANY, option

DEFAULT_CONCURRENCY = "1,2,4,8,16,32"  # the staircase where neither --concurrency nor --rate is given


@dataclass(frozen=True)
class LoadOptions:
    concurrency: str | None = option(
        None,
        help=f"Closed loop: concurrent requests per step [default: {DEFAULT_CONCURRENCY}].",
        metavar="N,N,...",
    )
    rate: str | None = option(
        None,
        help="Open loop: Poisson arrivals per second per step (instead of --concurrency).",
        metavar="R,R,...",
    )
    prompt_len: str | int = option(
        "128",
        help="Prompt length in tokens (approximate: common words): fixed N, uniform LO:HI, and "
        "optionally a fraction F of prompts K times longer, e.g. 256,long=0.1x4.",
        metavar="N|LO:HI[,long=FxK]",
    )
    shared_prefix: int = option(
        0,
        help="Start every prompt with the same N-token prefix (a system prompt), before its unique part.",
        metavar="N",
    )
    turns: int = option(
        1,
        help="K-turn conversations (--api chat): each request resends the conversation so far plus a new turn.",
        metavar="K",
    )
    # a study starts its own server and sends no headers
    headers: tuple[str, ...] = option(
        (),
        help="Send this header with every request (repeatable), e.g. a gateway's 'Authorization: Bearer KEY'; "
        "values are not recorded in the run JSON.",
        flag="--header",
        cli=MANY,
        metavar="'NAME: VALUE'",
        recipe=False,
    )
    session_header: str | None = option(
        None,
        help="Name each request's conversation in this header (e.g. x-session-id), for routers with "
        "session affinity (vLLM production stack: --routing-logic session --session-key NAME).",
        metavar="NAME",
    )
    context_len: int | None = option(
        None,
        help="The server's context length, to check the workload against [default: asked from the server].",
        metavar="TOKENS",
    )
    gen_len: int = option(64, help="max_tokens per request (EOS ignored where --engine allows).")
    step_seconds: float = option(30.0, help="Seconds of sending per step.")
    max_requests: int | None = option(None, help="At most this many requests per step.")
    slo: str | None = option(None, help="Latency objectives for goodput, in milliseconds.", metavar="ttft=MS,tpot=MS")
    api: str = option("completions", help="completions (/v1/completions) or chat (/v1/chat/completions).")
    # a study's default is None: the request fields of the engine its server runs
    engine: str = option(
        "openai", help="Server kind, for fixed-length output: openai, vllm, sglang, llamacpp, transformers."
    )
    timeout_s: float = option(
        60.0, help="Seconds before one request counts as a timeout.", flag="--timeout", key="timeout"
    )
    patience: int = option(1, help="Stop after this many saturated steps in a row.")
    no_stop: bool = option(False, help="Climb every level even past saturation.", cli=FLAG)
    seed: int = option(0, help="Seed for prompts and arrival times.")
    workload: str | None = option(
        None,
        help="A built-in workload of real text instead of --prompt-len: agent (multi-turn sessions, --api chat), "
        "long-short (short prompts and a fraction 16x longer; statistics per class), copy (answers that repeat "
        "the prompt).",
        metavar="NAME[:KEY=VALUE,...]",
    )
    search: bool = option(
        False,
        help="Find the highest load that meets --slo between the two levels given (--concurrency LO,HI or "
        "--rate LO,HI) by bracketing and bisection, instead of climbing every level.",
        cli=FLAG,
    )
    repeats: int = option(
        1,
        help="Steps per level (with --search: at the two levels around the knee); the knee's and each P99's "
        "95%% interval come from them.",
    )
    attribution: str | None = option(
        None,
        help="A quantkit bench result of the served model on this device: its attribution.bound names what a "
        "decode step is bound by, when TPOT degrades first.",
        metavar="BENCH.json[#ROW]",
    )
    admission: int | None = option(
        None,
        help="Admission gate (--rate only): at most N requests in flight; arrivals beyond it are rejected at "
        "once and counted (kind `rejected`).",
        metavar="N",
    )
    class_priority: str | None = option(
        None,
        help="Send vLLM's request priority per workload class (long-short: short=0,long=1; lower is served "
        "first under --scheduling-policy priority).",
        metavar="CLASS=N,...",
    )
    rerun_disturbed: int = option(
        0, help="Measure a step again, up to K times, when other processes used the cores during it.", metavar="K"
    )
    # a study knows the server it started
    server_pid: int | None = option(
        None,
        help="The server's process, for its cores and CPU [default: the process listening on a loopback URL's port].",
        metavar="PID",
        recipe=False,
    )
    label: str | None = option(None, help="Name of this run in tables, plots and comparisons.", recipe=False)
