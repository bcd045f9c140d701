#!/usr/bin/env python3
"""Serving levers where they act, on the demo model: the built-in CPU studies of one engine, each a
`quantkit levers` run of its levers against its own workload (studies/levers-ENGINE-KIND.yaml),
the server pinned to one core and the client to the other. Writes
benchmarks/results/levers-ENGINE.json: one table per study (lever_tables.py), each with the command,
machine and date that measured it, so that studies measured by separate runs share one file.

  llama-server: studies/levers-llama-server-{agent,long-short,admission,copy}.yaml, on the demo's F16
    GGUF; `copy`'s draft model is the Q4_0 GGUF of the demo's INT4 RTN g32 artifact (exact), made by
      quantkit convert int4-w4a16-rtn --model demo --set steps[0].quantize.group_size=32 --out WORK/demo-int4-g32
      quantkit export WORK/demo-int4-g32 --format gguf --out WORK/demo-q4_0.gguf
  vllm: studies/levers-vllm-cpu-{agent,long-short,admission,copy}.yaml, vLLM's CPU build on the demo checkpoint;
    `copy`'s draft model is the demo's INT4 W4A16 RTN artifact (quantkit convert int4-w4a16-rtn).

A study takes 15 to 40 minutes on 2 cores: run them one at a time, each under the machine's lock.
  python benchmarks/levers.py --engine llama-server --study agent
  python benchmarks/levers.py --engine vllm --study copy
  python benchmarks/levers.py --engine llama-server --tabulate      # the tables of the finished studies
  python benchmarks/levers.py --engine llama-server --study copy --load repeats=2 --load max_requests=20   # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from common import QUANTKIT, REPO, command, machine, write_result
from lever_tables import study_table, summary

from quantkit.external import vllm_env
from quantkit.gguf import tools
from quantkit.load.plot import plot_runs
from quantkit.load.runfile import LoadRun

KINDS = {
    "llama-server": ("agent", "long-short", "admission", "copy"),
    "vllm": ("agent", "long-short", "admission", "copy"),
}
STUDY_FILE = {"llama-server": "levers-llama-server-{}.yaml", "vllm": "levers-vllm-cpu-{}.yaml"}


def _run(args: list[str], env: dict | None = None) -> None:
    print("+ quantkit " + " ".join(args), file=sys.stderr)
    subprocess.run(QUANTKIT + args, env=env, check=True)


def prepare(work: Path, demo: str) -> dict[str, str]:
    """The demo's F16 GGUF and the Q4_0 GGUF of its INT4 RTN g32 artifact (made once in `work`)."""
    work.mkdir(parents=True, exist_ok=True)
    f16, q4_0, int4 = work / "demo-f16.gguf", work / "demo-q4_0.gguf", work / "demo-int4-g32"
    if not f16.is_file():
        _run(["export", demo, "--format", "gguf", "--out", str(f16)])
    if not q4_0.is_file():
        if not int4.is_dir():
            convert = ["convert", "int4-w4a16-rtn", "--model", "demo", "--set", "steps[0].quantize.group_size=32"]
            _run([*convert, "--out", str(int4)])
        _run(["export", str(int4), "--format", "gguf", "--out", str(q4_0)])
    return {"QK_GGUF": str(f16.resolve()), "QK_DRAFT_GGUF": str(q4_0.resolve())}


def scaled(study: Path, overrides: list[str], work: Path) -> Path:
    """The study with some of its `load:` keys changed (--load KEY=VALUE, a YAML value each), written
    into WORK: a smaller run of the same levers, its sizes named in the command that made it."""
    if not overrides:
        return study
    spec = yaml.safe_load(study.read_text())
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in spec["load"]:
            raise SystemExit(f"--load {item}: KEY=VALUE with a key of the study's load ({', '.join(spec['load'])})")
        spec["load"][key] = yaml.safe_load(value)
    out = work / study.name
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def measure(engine: str, kind: str, work: Path, overrides: list[str]) -> None:
    demo = subprocess.run(QUANTKIT + ["models", "path", "demo"], capture_output=True, text=True, check=True)
    env = {**os.environ, "QK_DEMO_MODEL": demo.stdout.strip()}
    if engine == "llama-server":
        env.update(prepare(work, demo.stdout.strip()))
    else:
        draft = work / "demo-int4"
        if not draft.is_dir():
            _run(["convert", "int4-w4a16-rtn", "--model", "demo", "--out", str(draft)])
        env["QK_DRAFT_MODEL"] = str(draft.resolve())
    out = work / kind
    study = scaled(REPO / "studies" / STUDY_FILE[engine].format(kind), overrides, work)
    _run(["levers", str(study), "--out", str(out), "--force"], env=env)
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # which run measured it: its table's source
    (out / "measured.json").write_text(json.dumps({"command": command(), "machine": machine(), "date": date}))


def tabulate(engine: str, work: Path) -> dict:
    """Each finished study's table, and its plot drawn into docs/images/levers-ENGINE-KIND.png
    (quantkit's own plot of a study's runs: the knees with their intervals, TTFT's parts)."""
    tables, studies = {}, {}
    for kind in KINDS[engine]:
        path = work / kind / "study.json"
        if not path.is_file():
            continue
        study = json.loads(path.read_text())
        table = study_table(kind, study)
        table["source"] = json.loads((work / kind / "measured.json").read_text())
        tables[kind.replace("-", "_")] = table
        studies[kind] = summary(study, REPO)
        runs = [LoadRun.from_json(run, f"{path}: runs[{i}]") for i, run in enumerate(study["runs"])]
        plot_runs(runs, REPO / "docs" / "images" / f"levers-{engine}-{kind}.png")
    return {"tables": tables, "studies": studies}


def build(engine: str) -> dict:
    if engine == "llama-server":
        return {"llama_server": tools.version("llama-server")}
    stamp = vllm_env.read_stamp(vllm_env.location()[0]) or {}
    return {"vllm": stamp.get("vllm") or stamp}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=list(KINDS), required=True)
    ap.add_argument("--work", help="the GGUFs and each study's output [default: runs/levers-ENGINE]")
    ap.add_argument("--study", action="append", default=[], help="measure this study (repeatable)")
    ap.add_argument("--tabulate", action="store_true", help="only tabulate the finished studies in WORK")
    ap.add_argument("--load", action="append", default=[], metavar="KEY=VALUE", help="change a load key of the study")
    args = ap.parse_args()
    work = Path(args.work or f"runs/levers-{args.engine}")
    unknown = set(args.study) - set(KINDS[args.engine])
    if unknown:
        ap.error(f"--study {sorted(unknown)[0]}: {args.engine} has {', '.join(KINDS[args.engine])}")
    for kind in [] if args.tabulate else (args.study or list(KINDS[args.engine])):
        measure(args.engine, kind, work, args.load)
    found = tabulate(args.engine, work)
    if not found["tables"]:
        raise SystemExit(f"no finished study in {work}")
    path = write_result(f"levers-{args.engine}", {"build": build(args.engine), **found})
    print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
