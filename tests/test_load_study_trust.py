"""A lever study is someone else's file: one that runs a command of its own or sets the server's
environment is refused (one line, exit 2, nothing started or written) unless the user passes
--trust-study; `--dry-run` shows everything a run would start, the environment included.

Each hostile study, had it run, would delete a victim file or leave a marker file behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


def _write(tmp_path: Path, server: dict, levers=None) -> Path:
    study = {
        "name": "s",
        "server": {"model": "m", **server},
        "load": {"concurrency": "1"},
        "levers": levers or [{"name": "base"}],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("keep me")
    return path


@pytest.fixture
def hook_dir(tmp_path) -> Path:
    """A directory whose sitecustomize.py (imported by any Python that has it on its path) leaves a marker."""
    folder = tmp_path / "hook"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"open({str(tmp_path / 'marker')!r}, 'w').write('ran')\n")
    return folder


def _hostile_servers(victim: Path, hook_dir: Path) -> dict[str, dict]:
    shell = ["sh", "-c", f"rm -f {victim}; touch {victim.parent / 'marker'}; sleep 30", "{port}"]
    return {
        "custom-command": {"engine": "custom", "command": shell},
        "pythonpath": {"engine": "llama-cpp-python", "env": {"PYTHONPATH": str(hook_dir)}},
        "ld-preload": {"engine": "llama-cpp-python", "env": {"LD_PRELOAD": str(hook_dir / "evil.so")}},
        "path": {"engine": "llama-server", "env": {"PATH": str(hook_dir)}},
        "pythonstartup-like": {
            "engine": "transformers-serve",
            "env": {"PYTHONSTARTUP": str(hook_dir / "sitecustomize.py")},
        },
        # a variable that may be set, with a value that is not one of its own
        "safe-name-bad-value": {"engine": "llama-cpp-python", "env": {"OMP_NUM_THREADS": "1; rm -rf ~"}},
    }


@pytest.mark.parametrize(
    "kind", ["custom-command", "pythonpath", "ld-preload", "path", "pythonstartup-like", "safe-name-bad-value"]
)
def test_a_study_that_runs_its_own_code_needs_trust(cli, tmp_path, victim, hook_dir, kind):
    study = _write(tmp_path, _hostile_servers(victim, hook_dir)[kind])
    code, stdout, stderr, _ = cli("levers", str(study), "--out", str(tmp_path / "out"))
    assert code == 2 and stderr.count("\n") == 1 and "--trust-study" in stderr, stderr
    assert victim.read_text() == "keep me" and not (tmp_path / "marker").exists()
    assert not (tmp_path / "out").exists() and stdout == ""  # refused before anything was created


def test_trust_runs_the_command(cli, tmp_path, victim):
    """--trust-study is what lets a custom command run (here it removes the victim, then exits)."""
    shell = ["sh", "-c", f"rm -f {victim}; exit 4", "{port}"]
    code, _, stderr, _ = cli(
        "levers",
        str(_write(tmp_path, {"engine": "custom", "command": shell})),
        "--out",
        str(tmp_path / "out"),
        "--trust-study",
    )
    assert code == 2 and "exited with code 4" in stderr and not victim.exists()


@pytest.mark.parametrize("engine", ["llama-cpp-python", "transformers-serve", "llama-server", "vllm"])
def test_only_the_custom_engine_takes_a_command_even_trusted(cli, tmp_path, victim, engine):
    study = _write(tmp_path, {"engine": engine, "command": ["sh", "-c", f"rm -f {victim}", "{port}"]})
    code, _, stderr, _ = cli("levers", str(study), "--out", str(tmp_path / "out"), "--trust-study")
    assert code == 2 and stderr.count("\n") == 1 and "only the custom engine runs a command" in stderr, stderr
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize(
    "server, levers, message",
    [
        # a string that an engine's argument parser would read as another flag
        (
            {"engine": "transformers-serve", "settings": {"quantization": "--trust-remote-code"}},
            None,
            "would be read as another flag",
        ),
        (
            {"engine": "llama-cpp-python"},
            [{"name": "a"}, {"name": "b", "settings": {"draft_model": "--config_file=x"}}],
            "would be read as another flag",
        ),
        ({"engine": "transformers-serve", "model": "--trust-remote-code"}, None, "is not a model"),
        ({"engine": "llama-cpp-python"}, [{"name": "a"}, {"name": "b", "model": "-h"}], "is not a model"),
        # the readiness check goes to the server on loopback, not to a host named in the path
        ({"engine": "llama-cpp-python", "ready": "@example.com/"}, None, "server.ready"),
        ({"engine": "llama-cpp-python", "ready": "health"}, None, "server.ready"),
    ],
)
def test_values_that_smuggle_flags_or_hosts_are_refused(cli, tmp_path, server, levers, message):
    code, _, stderr, _ = cli(
        "levers", str(_write(tmp_path, server, levers)), "--out", str(tmp_path / "out"), "--trust-study"
    )
    assert code == 2 and stderr.count("\n") == 1 and message in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_thread_counts_and_quiet_switches_need_no_trust(cli, tmp_path):
    env = {
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }
    study = _write(tmp_path, {"engine": "transformers-serve", "env": env})
    code, _, stderr, plan = cli("levers", str(study), "--dry-run", "--json")
    assert code == 0, stderr
    assert plan["needs_trust"] == [] and plan["levers"][0]["env"] == env


def test_dry_run_shows_the_environment_and_what_needs_trust(cli, tmp_path, victim, hook_dir):
    """Everything a run would start is on screen, also for a study that would be refused."""
    study = _write(
        tmp_path,
        {
            "engine": "custom",
            "command": ["{python}", "-m", "server", "{port}"],
            "env": {"PYTHONPATH": str(hook_dir), "OMP_NUM_THREADS": "2"},
        },
        levers=[{"name": "a"}, {"name": "b", "args": ["--x"]}],
    )
    code, stdout, stderr, _ = cli("levers", str(study), "--dry-run")
    assert code == 0, stderr
    lines = stdout.splitlines()
    for line, lever in zip(lines, ("a", "b")):
        assert line.startswith(f"{lever}: env OMP_NUM_THREADS=2 PYTHONPATH={hook_dir} ") and "-m server" in line
    assert "runs only with --trust-study" in lines[-1] and "server.env sets PYTHONPATH" in lines[-1]
    assert "OMP_NUM_THREADS" not in lines[-1]  # a thread count is not a reason
    code, stdout, _, plan = cli("levers", str(study), "--dry-run", "--json")
    assert plan["levers"][1]["env"] == {"PYTHONPATH": str(hook_dir), "OMP_NUM_THREADS": "2"}
    assert plan["levers"][1]["command"][-1] == "--x" and len(plan["needs_trust"]) == 2
    assert not (tmp_path / "marker").exists()


def test_the_run_records_what_it_was_trusted_with(cli, tmp_path):
    """A trusted run keeps the command and environment it ran with in the lever's run JSON."""
    fake = str(Path(__file__).resolve().parent / "load_fixtures" / "fake_server.py")
    study = _write(
        tmp_path,
        {
            "engine": "custom",
            "command": ["{python}", fake, "--port", "{port}"],
            "env": {"QK_STUDY_VAR": "x"},
            "ready_timeout_s": 60,
        },
    )
    data = yaml.safe_load(study.read_text())
    data["load"].update(max_requests=2, gen_len=4, prompt_len=8)
    study.write_text(yaml.safe_dump(data))
    code, _, stderr, _ = cli("levers", str(study), "--out", str(tmp_path / "out"), "--trust-study")
    assert code == 0, stderr
    run = json.loads((tmp_path / "out" / "00-base.json").read_text())
    assert run["server"]["env"] == {"QK_STUDY_VAR": "x"} and run["server"]["command"][1] == fake
