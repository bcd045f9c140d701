"""A lever study file: YAML -> frozen, validated objects, checked once, before any server starts.

    name: llamacpp-levers
    server:                      # how to start the engine (servers.SERVERS)
      engine: llama-cpp-python
      model: ${DEMO_GGUF}        # environment variables are expanded
      settings: {n_threads: 2}   # engine keys every lever starts from
      env: {OMP_NUM_THREADS: "1"}  # thread counts and quiet/offline switches only, unless trusted
    load:                        # the staircase: `quantkit load` options
      concurrency: "1,2,4"
      gen_len: 16
      slo: ttft=5000,tpot=2000
    levers:                      # the first is the baseline; each other changes one thing
      - name: baseline
      - name: q4_0
        model: ${DEMO_Q4_0}
      - name: ram-cache
        settings: {cache: true}

Errors name the file and the key path (`study.yaml: levers[2].settings: ...`).

A study is a file someone else may have written. It starts an engine from quantkit's own
template with flags quantkit builds; a study that runs a command of its own (`custom` engine) or
sets a variable outside SAFE_ENV in the server's environment (PYTHONPATH, LD_PRELOAD, PATH, ...
make the server run other code) runs only with `trusted=True` (`--trust-study`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from quantkit.core.hardware import shape_config
from quantkit.core.yamlio import NoAliasLoader, StrictConfig, format_validation_error
from quantkit.errors import QuantkitError
from quantkit.load.bench_bound import read_attribution
from quantkit.load.config import build_config
from quantkit.load.load_options import LoadOptions
from quantkit.load.servers import StudyError, server_kind
from quantkit.load.workload import WorkloadError, check_fits
from quantkit.recipe.section_fields import section_model, section_values

MAX_STUDY_BYTES = 1 << 20
PLAIN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"  # lever and study names name files
_UNSET = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
_COUNT = r"[0-9]{1,4}"
# Environment variables a study may set without --trust-study, with the values each accepts:
# thread counts and quiet/offline switches, which change how fast a server runs, not what it runs.
SAFE_ENV: dict[str, str] = {
    "OMP_NUM_THREADS": _COUNT,
    "MKL_NUM_THREADS": _COUNT,
    "OPENBLAS_NUM_THREADS": _COUNT,
    "TOKENIZERS_PARALLELISM": "true|false",
    "HF_HUB_OFFLINE": "[01]",
    "TRANSFORMERS_OFFLINE": "[01]",
    "HF_HUB_DISABLE_TELEMETRY": "[01]",
    "TRANSFORMERS_VERBOSITY": "debug|info|warning|error|critical",
    "CUDA_VISIBLE_DEVICES": "[0-9,]{0,64}",
}


class ServerSpec(StrictConfig):
    engine: str
    model: str = Field(min_length=1)
    served_model: str | None = None  # the model name requests carry; default: `model` as given
    command: tuple[str, ...] | None = None  # default: the engine's template (required for `custom`)
    settings: dict[str, Any] = {}
    env: dict[str, str] = {}
    ready: str | None = None  # the readiness path; default: the engine's
    ready_timeout_s: float = Field(300.0, gt=0)
    cpus: str | None = None  # the cores the server runs on (taskset's list: "0", "0-1", "0,2")

    @field_validator("cpus")
    @classmethod
    def _cores(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cores(value)
        return value

    @field_validator("ready")
    @classmethod
    def _a_path(cls, value: str | None) -> str | None:
        # appended to http://127.0.0.1:PORT: "@host/" would send the check to another host
        if value is not None and not re.fullmatch(r"/[^\s@]*", value):
            raise ValueError(f"a path on the server, starting with / (got {value!r})")
        return value


def parse_cores(spec: str) -> tuple[int, ...]:
    """taskset's list syntax ("0", "0-1", "0,2-3") -> the cores, or ValueError."""
    cores: set[int] = set()
    for part in str(spec).split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"a list of cores as taskset takes it (0, 0-1, 0,2), got {spec!r}")
        cores.update(range(int(low), int(high or low) + 1))
    available = set(range(os.cpu_count() or 1))
    if not cores <= available:
        raise ValueError(f"cores {sorted(cores - available)} are not available here (the machine has {len(available)})")
    return tuple(sorted(cores))


# Where a study's `load:` differs from `quantkit load` (the rest is load/load_options.py's fields):
# three steps per level around the knee, for a 95% interval on the knee and on each P99; and the
# request fields of the engine the study's server runs, unless it names one.
STUDY_LOAD_DEFAULTS = {"repeats": 3, "engine": None}


class LoadSpec(section_model("LoadKeys", LoadOptions, StrictConfig, defaults=STUDY_LOAD_DEFAULTS)):
    """The staircase, as `quantkit load` options (same names but `timeout`, same validation)."""

    @field_validator("concurrency", "rate", mode="before")
    @classmethod
    def _one_level(cls, value: Any) -> Any:
        """One level written as a number (`concurrency: 4`, `rate: 0.5`) is that level's spec."""
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


class Lever(StrictConfig):
    name: str = Field(pattern=PLAIN)
    settings: dict[str, Any] = {}  # engine keys this lever changes
    model: str | None = None  # another weights file (e.g. Q4_0 against F16)
    args: tuple[str, ...] = ()  # `custom` engines only: raw command-line arguments
    load: dict[str, Any] = {}  # staircase options this lever changes (a workload lever)
    note: str | None = None


class Reference(StrictConfig):
    shape: str  # a model directory or config.json: the roofline's prefill estimate of the shared prefix
    # the lever whose prefix is prefilled every time (cache off), that the others' TTFT is set
    # against; default the first. llama-server caches by default, so its study names the lever that turns it off.
    baseline: str | None = None


class Study(StrictConfig):
    name: str = Field(pattern=PLAIN)
    description: str | None = None
    client_cpus: str | None = None  # the cores quantkit's client runs on while the study runs

    @field_validator("client_cpus")
    @classmethod
    def _client_cores(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cores(value)
        return value

    server: ServerSpec
    load: LoadSpec = LoadSpec()
    levers: tuple[Lever, ...] = Field(min_length=1)
    reference: Reference | None = None

    @model_validator(mode="after")
    def _checks(self) -> "Study":
        kind = server_kind(self.server.engine)
        if kind.own_command and not self.server.command:
            raise ValueError("server.command: a custom engine needs its command (a list with {port})")
        if not kind.own_command and self.server.command is not None:
            raise ValueError(
                f"server.command: only the custom engine runs a command of its own; {kind.name} "
                "runs its template with the study's settings (quantkit levers --engines)"
            )
        if self.server.command is not None and not any("{port}" in part for part in self.server.command):
            raise ValueError("server.command: the command must take {port} (the study picks a free loopback port)")
        for name in self.server.settings:
            kind.key(name, "server.settings")
        names = [lever.name for lever in self.levers]
        if len(set(names)) != len(names):
            raise ValueError(f"levers: names must be unique, got {names}")
        for i, lever in enumerate(self.levers):
            _check_lever(kind, lever, f"levers[{i}]", baseline=i == 0)
            _merged_load(self.load, lever, f"levers[{i}].load")
        if self.reference and self.reference.baseline is not None and self.reference.baseline not in names:
            raise ValueError(
                f"reference.baseline: no lever is named {self.reference.baseline!r}; levers: {', '.join(names)}"
            )
        return self


def untrusted(study: Study) -> list[str]:
    """What in the study runs code of its author's choosing: empty when it only picks an engine,
    its settings and models."""
    reasons = []
    if study.server.command is not None:
        reasons.append(f"server.command runs {study.server.command[0]!r}")
    for name, value in study.server.env.items():
        pattern = SAFE_ENV.get(name)
        if pattern is None or not re.fullmatch(pattern, value):
            reasons.append(f"server.env sets {name}")
    return reasons


def check_trusted(study: Study, label: str, trusted: bool) -> None:
    """Refuse, before anything starts, a study that runs its own code when the user did not say
    they trust it."""
    reasons = untrusted(study)
    if reasons and not trusted:
        raise StudyError(
            f"{label}: {'; '.join(reasons)}: this study runs code of its author's choosing; "
            "read it (quantkit levers --dry-run), then pass --trust-study"
        )


def _merged_load(base: LoadSpec, lever: Lever, where: str) -> LoadSpec:
    try:
        return LoadSpec.model_validate({**base.model_dump(), **lever.load})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(part) for part in err["loc"])
        raise ValueError(f"{where}.{loc}: {err['msg'][:1].lower()}{err['msg'][1:]}") from None


def _check_lever(kind, lever: Lever, where: str, baseline: bool) -> None:
    for name in lever.settings:
        kind.key(name, f"{where}.settings")
    if lever.args and not kind.own_command:
        raise ValueError(
            f"{where}.args: raw arguments are for custom engines; {kind.name} levers are settings: "
            f"{', '.join(sorted(kind.keys))}"
        )
    server_changes = len(lever.settings) + (lever.model is not None) + bool(lever.args)
    if server_changes > 1:
        raise ValueError(
            f"{where}: a lever changes one thing (settings, model or args); split it into {server_changes} levers"
        )
    if not baseline and not server_changes and not lever.load:
        raise ValueError(f"{where}: changes nothing against the baseline (give settings, model, args or load)")
    unknown = set(lever.load) - set(LoadSpec.model_fields)
    if unknown:
        raise ValueError(
            f"{where}.load: unknown option(s) {', '.join(sorted(unknown))}; options: {', '.join(LoadSpec.model_fields)}"
        )


def expand(text: str, where: str) -> str:
    """Environment variables and ~ in a path; an unset variable is an error, not an empty string."""
    out = os.path.expanduser(os.path.expandvars(text))
    left = _UNSET.search(out)
    if left:
        raise StudyError(f"{where}: {left.group(0)} is not set in the environment")
    return out


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.endswith(".gguf")


def server_model(model: str, where: str) -> str:
    path = expand(model, where)
    if path.startswith("-"):  # it is an engine argument: it would be read as a flag
        raise StudyError(f"{where}: {path!r} is not a model (it starts with '-')")
    if _looks_like_path(path) and not Path(path).exists():
        raise StudyError(f"{where}: {path} does not exist")
    return path


def read_study(path: str | Path) -> Study:
    """The study file -> a validated Study (its load options checked like `quantkit load`'s)."""
    p, label = Path(path), str(path)
    if not p.is_file():
        raise StudyError(f"{label}: no such study file")
    raw = p.read_bytes()[: MAX_STUDY_BYTES + 1]
    if len(raw) > MAX_STUDY_BYTES:
        raise StudyError(f"{label}: not a study file (larger than 1 MiB)")
    try:
        data = yaml.load(raw.decode("utf-8-sig"), Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError:
        raise StudyError(f"{label}: not a study file (not UTF-8 text)") from None
    except (yaml.YAMLError, RecursionError) as exc:
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise StudyError(f"{label}: not valid YAML{where}{': ' + problem if problem else ''}") from None
    if not isinstance(data, dict):
        raise StudyError(f"{label}: a study is a YAML mapping with server:, load: and levers:")
    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        raise StudyError(format_validation_error(label, exc)) from None
    for i, lever in enumerate(study.levers):
        try:
            cfg = load_config(study, lever)
            _check_context(study, lever, cfg)
        except StudyError as exc:  # the load options, checked as `quantkit load` checks them
            raise StudyError(f"{label}: levers[{i}] ({lever.name}) load: {exc}") from None
    if study.reference:
        reference_shape(study)
    return study


def _check_context(study: Study, lever: Lever, cfg) -> None:
    """A workload that cannot fit the context the study gives the server (load.context_len, or the
    engine's context setting) is refused before any server starts; the run checks again against
    what the server itself reports."""

    if cfg.context_len:
        context = (cfg.context_len, "load.context_len")
    else:
        context = server_kind(study.server.engine).context_tokens({**study.server.settings, **lever.settings})
    if context:
        try:
            check_fits(cfg.workload, cfg.gen_len, *context)
        except WorkloadError as exc:
            raise StudyError(str(exc)) from None


def reference_shape(study: Study) -> str:
    """The reference shape's path (variables expanded), checked to be a model config."""

    shape = expand(study.reference.shape, "reference.shape")
    try:
        shape_config(shape)
    except QuantkitError as exc:
        raise StudyError(f"reference.shape: {exc}") from None
    return shape


def load_config(
    study: Study,
    lever: Lever,
    url: str = "http://127.0.0.1:1",
    model: str | None = None,
    extra_body: dict | None = None,
):
    """The `quantkit load` config of one lever (a placeholder URL when only validating)."""
    given = section_values(_merged_load(study.load, lever, "load"), LoadOptions)
    engine = given.pop("engine") or server_kind(study.server.engine).load_engine
    attribution = given["attribution"]
    served = study.server.served_model or model or study.server.model
    try:
        return build_config(
            LoadOptions(**given, engine=engine, label=lever.name),
            url=url,
            model=served,
            extra_body=extra_body,
            attribution=read_attribution(expand(attribution, "load.attribution")) if attribution else None,
        )
    except QuantkitError as exc:
        raise StudyError(str(exc)) from None
