"""Run a lever study: per lever, start the engine on loopback, wait until ready, run the staircase,
stop the engine (always: also on Ctrl-C, SIGTERM or a fault), and keep every run.

The output directory holds one `quantkit load` run JSON per lever (inputs to `quantkit compare`,
each with the exact server command under "server"), its server log, and `study.json` with the
lever table (levers_report.py), rewritten after every lever.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import shlex
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quantkit.core.atomic import json_safe, write_json
from quantkit.errors import QuantkitError
from quantkit.load.config import LoadConfig
from quantkit.load.lever_records import LeverStudy
from quantkit.load.levers_report import summarize
from quantkit.load.load_run import build_run
from quantkit.load.load_steps import Progress, Terminated, run
from quantkit.load.process import free_port, running
from quantkit.load.runfile import LeverServer, LoadRun
from quantkit.load.servers import StudyError, fill, lever_args, not_here, server_kind
from quantkit.load.study import Lever, Study, check_trusted, expand, load_config, parse_cores, server_model

HOST = "127.0.0.1"


@dataclass(frozen=True)
class LeverPlan:
    """What one lever runs: the exact command and what it adds to the environment, the request-body
    fields, the model, the load config."""

    lever: str
    engine: str
    model: str
    settings: dict
    changes: str
    command: list[str]
    env: dict
    body_fields: dict
    not_run_here: object
    server_cpus: str | None
    client_cpus: str | None
    cfg: LoadConfig

    def to_json(self) -> dict:
        """The plan as `quantkit levers --dry-run --json` shows it (the load config as `load`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "cfg"}
        return {**out, "load": self.cfg.to_dict()}


def lever_plan(study: Study, index: int, port: int | None = None, check: bool = False) -> LeverPlan:
    """What one lever runs: the exact command and what it adds to the environment, the request-body
    fields, the model, the load config. With a port (a lever about to start) or `check`, an engine
    that is not installed (vLLM's environment, the llama-server binary) is one line here."""
    check = check or port is not None
    lever = study.levers[index]
    kind = server_kind(study.server.engine)
    where = f"levers[{index}] ({lever.name})"
    model = server_model(lever.model or study.server.model, f"{where}: model" if lever.model else "server.model")
    settings = {
        name: _expanded(value, f"{where}.settings.{name}")
        for name, value in {**study.server.settings, **lever.settings}.items()
    }
    for name, value in settings.items():
        # a missing file (a draft model) is refused here, before a server starts, not in its log
        if kind.key(name, where).file and not Path(str(value)).is_file():
            raise StudyError(f"{where}.settings.{name}: {value} is not a file")
    args, body = lever_args(kind, settings, where)
    python = kind.python(check=check)  # a dry run shows an engine's own Python, installed or not
    values = {"python": python, "model": model, "host": HOST, "port": str(port or "{port}")}
    command = fill(study.server.command or kind.command, values) + args + list(lever.args)
    if kind.program and not study.server.command:  # the built binary, not whatever PATH holds
        command[0] = kind.program(check)
    url = f"http://{HOST}:{port}" if port else "http://127.0.0.1:1"
    return LeverPlan(
        lever=lever.name,
        engine=kind.name,
        model=model,
        settings=settings,
        changes=_changes(lever, model, {name: settings[name] for name in lever.settings}, kind),
        command=command,
        env=dict(study.server.env),
        body_fields=body,
        not_run_here=not_here(kind, settings),
        server_cpus=study.server.cpus,
        client_cpus=study.client_cpus,
        cfg=load_config(study, lever, url=url, model=model, extra_body=body),
    )


def _expanded(value, where: str):
    """Environment variables in a setting, also inside a JSON value (vLLM's speculative_config)."""
    if isinstance(value, str):
        return expand(value, where)
    if isinstance(value, dict):
        return {k: _expanded(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expanded(v, where) for v in value]
    return value


def _changes(lever: Lever, model: str, settings: dict, kind) -> str:
    """The lever in one line: its settings (a file by its name, its variables expanded), model, args, load."""
    parts = [f"{k}={Path(v).name if kind.keys[k].file else v}" for k, v in settings.items()]
    parts += [f"model={Path(model).name}"] if lever.model else []  # the file, its variables expanded
    parts += [shlex.join(lever.args)] if lever.args else []
    parts += [f"load.{k}={v}" for k, v in lever.load.items()]
    return ", ".join(parts) or "baseline"


def _write(out: Path, name: str, data: LoadRun | LeverStudy) -> None:
    try:
        write_json(out / name, json_safe(data.to_json()))
    except OSError as exc:
        raise StudyError(f"--out: cannot write {out / name}: {exc.strerror or exc}") from None


def _sigterm(signum, frame) -> None:
    raise Terminated("terminated (SIGTERM)")


def _guard_sigterm() -> None:
    """SIGTERM outside the staircase (starting or stopping a server) unwinds through the finally
    that stops the server. The staircase's event loop installs its own handler and, when it
    closes, resets SIGTERM to the default, so this is re-armed before each lever."""
    try:
        signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # not the main thread (an embedding program): its own handling applies
        pass


def _run_lever(study: Study, index: int, out: Path, log: Callable[[str], None]) -> tuple[LoadRun, BaseException | None]:
    """One lever: start, wait, staircase, stop. Returns the run JSON (also written to out) and what
    cut it short (Ctrl-C, SIGTERM, a fault), if anything did."""
    lever, kind = study.levers[index], server_kind(study.server.engine)
    port = free_port()
    plan = lever_plan(study, index, port)
    slug = f"{index:02d}-{lever.name}"
    ready = study.server.ready or kind.ready
    _guard_sigterm()
    log(f"[{lever.name}] starting: {shlex.join(plan.command)}")
    progress, failure = Progress(), None
    cores = parse_cores(study.server.cpus) if study.server.cpus else None
    with running(
        plan.command,
        plan.cfg.url,
        out / f"{slug}.server.log",
        study.server.env,
        ready,
        study.server.ready_timeout_s,
        cores,
    ) as server:
        log(f"[{lever.name}] ready in {server.ready_s:.0f} s")
        # the server's process tree (the supervisor and what it started): its cores and CPU per step
        cfg = dataclasses.replace(plan.cfg, server_pid=server.proc.pid)
        try:
            run(cfg, progress, log=lambda line: log(f"[{lever.name}] {line}"))
        except QuantkitError as exc:
            if not progress.started:  # the warm-up failed: nothing measured, say which lever
                raise StudyError(f"levers[{index}] ({lever.name}): {exc}") from None
            failure = exc
        except (KeyboardInterrupt, Terminated, Exception) as exc:  # keep what was measured, then re-raise
            failure = exc
        finally:
            _guard_sigterm()
        result = build_run(cfg, progress)
    started = LeverServer(
        engine=plan.engine,
        command=plan.command,
        model=plan.model,
        settings=plan.settings,
        body_fields=plan.body_fields,
        env=study.server.env,
        changes=plan.changes,
        ready_s=server.ready_s,
        pid=server.proc.pid,
        exit_code=server.proc.returncode,
        log=f"{slug}.server.log",
    )
    result = dataclasses.replace(result, server=started, file=f"{slug}.json")
    _write(out, result.file, result)
    return result, failure


def run_study(
    study: Study, out: Path, *, source: str, log: Callable[[str], None], sink: dict | None = None, trusted: bool = False
) -> LeverStudy:
    """Every lever in order; `study.json` is rewritten after each, and on the way out of a failure
    once a lever has run.
    `sink["result"]` holds the result as it grows, for a caller that is interrupted. A study that
    runs its own command or sets the server's environment needs `trusted` (study.check_trusted)."""

    check_trusted(study, source, trusted)

    result = LeverStudy(
        name=study.name,
        source=source,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        study=study.model_dump(),
    )
    if sink is not None:
        sink["result"] = result
    previous = signal.getsignal(signal.SIGTERM)
    affinity = os.sched_getaffinity(0) if study.client_cpus else None
    if study.client_cpus:
        os.sched_setaffinity(0, parse_cores(study.client_cpus))  # the client's core, for the whole study
    try:
        for index in range(len(study.levers)):
            lever_run, failure = _run_lever(study, index, out, log)
            result.runs.append(lever_run)
            if failure is not None:
                raise failure
            summarize(study, result)
            _write(out, "study.json", result)
        result.stopped = "done"
    except KeyboardInterrupt:
        result.stopped = "interrupted"
        raise
    except Terminated:
        result.stopped = "terminated"
        raise
    except Exception as exc:
        result.stopped = "error"
        result.error = str(exc)[:400]
        raise
    finally:
        if result.runs:  # a study no lever ran in leaves no study.json: the same command runs it again
            summarize(study, result)
            _write(out, "study.json", result)
        try:
            signal.signal(signal.SIGTERM, previous)
        except (ValueError, TypeError):
            pass
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
    return result
