"""`quantkit levers`: study files validated at the edge, servers started and always stopped, the lever table.

End to end with the scripted server (tests/load_fixtures/fake_server.py) as a `custom` engine whose
levers are raw arguments (--slots), so the knee must move; real engines are checked by their commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from fixtures import STUDIES

from quantkit.cli import cli
from quantkit.load.lever_records import LeverStudy
from quantkit.load.levers_report import lever_table, prefix_reference, render_table
from quantkit.load.runfile import LoadRun
from quantkit.load.step_record import Latency, Step

REPO = Path(__file__).resolve().parents[1]
FAKE = str(REPO / "tests" / "load_fixtures" / "fake_server.py")
FIXTURES = REPO / "tests" / "load_fixtures"
LOAD = {
    "concurrency": "1,2,4,8",
    "prompt_len": 16,
    "gen_len": 8,
    "step_seconds": 2,
    "max_requests": 12,
    "slo": "ttft=150",
    "timeout": 20,
    "repeats": 2,
}


def _fake_study(tmp_path: Path, levers=None, **server) -> Path:
    study = {
        "name": "fake-slots",
        "server": {
            "engine": "custom",
            "model": "m",
            "ready_timeout_s": 60,
            "command": ["{python}", FAKE, "--port", "{port}", "--slots", "1"],
            **server,
        },
        "load": LOAD,
        "levers": levers or [{"name": "one-slot"}, {"name": "four-slots", "args": ["--slots", "4"]}],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _levers(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["levers", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def _trusted(*args) -> tuple[int, str, str]:
    """A study that runs its own command (the stub as a `custom` engine) runs only with --trust-study."""
    return _levers(*args, "--trust-study")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0): read its state
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "Z"
    return state == "Z"


def test_a_study_moves_the_knee_and_stops_its_servers(tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = _trusted(_fake_study(tmp_path), "--out", out)
    assert code == 0, stderr
    study = json.loads((out / "study.json").read_text())
    assert study["kind"] == "lever-study" and study["stopped"] == "done" and len(study["runs"]) == 2
    base, four = study["table"]
    assert base["knee_offered"] == 1 and four["knee_offered"] == 4 and four["knee_qps_ratio"] > 2.5
    assert four["changes"] == "--slots 4" and four["degraded_first"] == "ttft" and four["goodput_qps"] > 0
    for run in study["runs"]:
        server = run["server"]
        assert server["command"][0] == sys.executable and "--port" in server["command"]
        assert _gone(server["pid"]) and server["exit_code"] is not None
        assert json.loads((out / run["file"]).read_text())["server"]["command"] == server["command"]
        assert (out / server["log"]).exists()
    assert study["runs"][1]["server"]["command"][-2:] == ["--slots", "4"]
    assert study["comparison"]["verdicts"] and "the SLO knee moved" in study["comparison"]["verdicts"][0]
    assert four["slo_knee_shift"]["moved"] and four["slo_knee_shift"]["ci95"][0] > 1.5
    steps = study["runs"][0]["steps"]  # two passes over the levels the first pass reached
    assert sorted((s["offered"], s["repeat"]) for s in steps) == [(lv, r) for lv in (1, 2) for r in (0, 1)]
    assert (out / "levers.png").read_bytes()[:4] == b"\x89PNG"
    assert "| four-slots | --slots 4 | concurrency=4 |" in (out / "levers.md").read_text()
    assert "| one-slot | baseline |" in stdout
    code, _, stderr = _trusted(_fake_study(tmp_path), "--out", out)  # an earlier study is not replaced silently
    assert code == 2 and "--force" in stderr


def test_a_workload_lever_and_json_output(tmp_path):
    levers = [
        {"name": "unique", "load": {"prompt_len": 48}},
        {"name": "shared", "load": {"shared_prefix": 32, "prompt_len": 16}},
    ]
    study = _fake_study(tmp_path, levers=levers, command=["{python}", FAKE, "--port", "{port}", "--cache", "usage"])
    result = CliRunner().invoke(cli, ["levers", str(study), "--out", str(tmp_path / "o"), "--json", "--trust-study"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    unique, shared = data["table"]
    assert unique["changes"] == "load.prompt_len=48" and unique["first_cache_hit"] < 0.1
    assert shared["first_cache_hit"] > 0.5
    assert data["runs"][1]["config"]["workload"]["shared_prefix"] == 32


def _count_line(stderr: str) -> int:
    return len([line for line in stderr.splitlines() if line.startswith("error:")])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"server": {"engine": "tgi", "model": "m"}}, "unknown 'tgi'; choose one of"),
        ({"levers": [{"name": "a"}, {"name": "b", "settings": {"n_parallel": 4}}]}, "has no lever 'n_parallel'"),
        (
            {"levers": [{"name": "a"}, {"name": "b", "settings": {"cache": True, "n_threads": 1}}]},
            "a lever changes one thing",
        ),
        ({"levers": [{"name": "a"}, {"name": "a", "settings": {"cache": True}}]}, "names must be unique"),
        ({"levers": [{"name": "a"}, {"name": "b"}]}, "changes nothing against the baseline"),
        ({"levers": [{"name": "../x"}]}, "levers[0].name: must be a plain name"),
        ({"levers": []}, "levers"),
        ({"levers": [{"name": "a"}, {"name": "b", "load": {"prompt_len": "9:3"}}]}, "levers[1] (b) load: --prompt-len"),
        ({"levers": [{"name": "a"}, {"name": "b", "load": {"promptlen": 3}}]}, "unknown option(s) promptlen"),
        ({"levers": [{"name": "a"}, {"name": "b", "load": {"gen_len": "many"}}]}, "levers[1].load.gen_len"),
        ({"levers": [{"name": "a"}, {"name": "b", "args": ["--x"]}]}, "raw arguments are for custom engines"),
        ({"load": {"shared_prefix": -4}}, "--shared-prefix"),
        ({"surprise": 1}, "surprise: unknown key"),
        ({"server": {"engine": "custom", "model": "m"}}, "a custom engine needs its command"),
        ({"server": {"engine": "custom", "model": "m", "command": ["x"]}}, "must take {port}"),
        ({"server": {"engine": "llama-cpp-python", "model": "${QK_SURELY_UNSET}"}}, "${QK_SURELY_UNSET} is not set"),
        (
            {"server": {"engine": "llama-cpp-python", "model": "/nonexistent/m.gguf"}},
            "/nonexistent/m.gguf does not exist",
        ),
        # a shared prefix longer than the context the study gives the server, refused before it starts
        (
            {
                "server": {"engine": "llama-cpp-python", "model": "m", "settings": {"n_ctx": 512}},
                "load": {"concurrency": "1", "shared_prefix": 600},
            },
            "--shared-prefix 600 is longer than the server's context (512",
        ),
        ({"load": {"concurrency": "1", "shared_prefix": 4000}}, "(2048 tokens, llama-cpp-python's default n_ctx)"),
        (
            {
                "levers": [{"name": "a"}, {"name": "b", "settings": {"n_ctx": 256}}],
                "load": {"concurrency": "1", "shared_prefix": 200, "prompt_len": 64},
            },
            "levers[1] (b) load: the longest request",
        ),
        (
            {
                "server": {"engine": "llama-server", "model": "m", "settings": {"ctx_size": 4096, "parallel": 4}},
                "load": {"concurrency": "1", "shared_prefix": 1500},
            },
            "ctx_size 4096 / settings.parallel 4",
        ),
        ({"load": {"concurrency": "1", "shared_prefix": 300, "context_len": 256}}, "(256 tokens, load.context_len)"),
        (
            {
                "server": {"engine": "vllm", "model": "m", "settings": {"max_model_len": 128}},
                "load": {"concurrency": "1", "shared_prefix": 128},
            },
            "settings.max_model_len",
        ),
    ],
)
def test_bad_studies_are_one_line_and_exit_2(tmp_path, change, message):
    study = {
        "name": "s",
        "server": {"engine": "llama-cpp-python", "model": "m"},
        "load": {"concurrency": "1"},
        "levers": [{"name": "base"}],
        **change,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    code, _, stderr = _levers(path, "--out", tmp_path / "o")
    assert code == 2 and _count_line(stderr) == 1 and message in stderr, stderr
    assert not (tmp_path / "o").exists()  # refused before anything was started or written


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"- a\n- list\n", b"key: [unclosed"])
def test_files_that_are_not_studies(tmp_path, content):
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    code, _, stderr = _levers(path)
    assert code == 2 and _count_line(stderr) == 1
    assert _levers(tmp_path / "missing.yaml")[0] == 2


def test_dry_run_shows_the_exact_commands(tmp_path):
    study = {
        "name": "s",
        "server": {"engine": "transformers-serve", "model": "/tmp", "settings": {"dtype": "float32"}},
        "levers": [{"name": "no-cb"}, {"name": "cb", "settings": {"continuous_batching": True}}],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    result = CliRunner().invoke(cli, ["levers", str(path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    no_cb, cb = json.loads(result.stdout)["levers"]
    assert no_cb["command"][-2:] == ["--dtype", "float32"] and cb["command"][-1] == "--continuous-batching"
    assert cb["load"]["engine"] == "transformers" and "{port}" in " ".join(cb["command"])
    draft = tmp_path / "d.gguf"
    draft.write_bytes(b"GGUF")
    llama = {
        "name": "s",
        "server": {"engine": "llama-server", "model": "/tmp"},
        "levers": [
            {"name": "on"},
            {"name": "off", "settings": {"cache_prompt": False}},
            {"name": "np4", "settings": {"parallel": 4}},
            {"name": "spec", "settings": {"model_draft": str(draft)}},
        ],
    }
    path.write_text(yaml.safe_dump(llama))
    plans = json.loads(CliRunner().invoke(cli, ["levers", str(path), "--dry-run", "--json"]).stdout)["levers"]
    assert plans[1]["body_fields"] == {"cache_prompt": False} and plans[1]["load"]["extra_body"] == {
        "cache_prompt": False
    }
    assert plans[2]["command"][-2:] == ["--parallel", "4"] and plans[3]["not_run_here"] == []
    # a draft model alone is loaded but not used: the speculator type comes with it
    assert plans[3]["command"][-4:] == ["--model-draft", str(draft), "--spec-type", "draft-simple"]
    listing = CliRunner().invoke(cli, ["levers", "--engines"])
    assert listing.exit_code == 0, listing.output
    engines = {line.split(":")[0]: line for line in listing.stdout.splitlines() if line and not line.startswith(" ")}
    assert list(engines) == ["transformers-serve", "llama-cpp-python", "llama-server", "vllm", "custom"]
    assert engines["llama-server"].startswith("llama-server: llama-server -m '{model}'")
    assert (
        "  parallel " in listing.stdout and "--parallel (value)" in listing.stdout
    )  # a setting, with the flag it becomes


def test_a_server_that_fails_to_start_is_one_line_with_its_last_words(tmp_path):
    crash = [
        "{python}",
        "-c",
        "import sys; print('loading...'); print('fatal: no such model', file=sys.stderr); sys.exit(3)",
        "{port}",
    ]
    code, _, stderr = _trusted(_fake_study(tmp_path, command=crash), "--out", tmp_path / "o")
    assert code == 2 and _count_line(stderr) == 1
    assert "exited with code 3" in stderr and "fatal: no such model" in stderr


def test_a_server_that_never_gets_ready_is_stopped(tmp_path):
    pid_file = tmp_path / "pid"
    sleeper = [
        "{python}",
        "-c",
        "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)",
        str(pid_file),
        "{port}",
    ]
    code, _, stderr = _trusted(_fake_study(tmp_path, command=sleeper, ready_timeout_s=2), "--out", tmp_path / "o")
    assert code == 2 and "not ready within 2 s" in stderr
    assert _gone(int(pid_file.read_text()))


def test_a_warm_up_failure_names_the_lever(tmp_path):
    failing = ["{python}", FAKE, "--port", "{port}", "--fail-every", "1"]
    code, _, stderr = _trusted(_fake_study(tmp_path, command=failing), "--out", tmp_path / "o")
    assert code == 2 and "levers[0] (one-slot)" in stderr and "HTTP 500" in stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_the_server_and_keep_the_runs(tmp_path, sig, code):
    study = _fake_study(tmp_path)
    data = yaml.safe_load(study.read_text())
    data["load"].update(max_requests=None, step_seconds=30)  # a long first step, cut short
    study.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-c",
        "from quantkit.cli import main; main()",
        "levers",
        str(study),
        "--out",
        str(out),
        "--trust-study",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for _ in range(50):
            line = proc.stderr.readline()
            if "warm-up ok" in line or not line:
                break
        assert "warm-up ok" in line, line
        time.sleep(1.0)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    study_json = json.loads((out / "study.json").read_text())
    assert study_json["stopped"] == ("interrupted" if sig == signal.SIGINT else "terminated")
    run = study_json["runs"][0]
    assert run["steps"][0]["partial"] and run["steps"][0]["completed"] > 0
    assert _gone(run["server"]["pid"])


def test_the_lever_table_on_stored_runs():
    runs = [
        LoadRun.from_json(json.loads((FIXTURES / f"attribution_{name}.json").read_text()), name)
        for name in ("nocb", "cb")
    ]
    table = lever_table(runs)
    rows = [row.to_json() for row in table]
    assert rows[0]["knee_qps_ratio"] == 1.0 and rows[1]["peak_qps_ratio"] == pytest.approx(1.33, abs=0.01)
    assert rows[1]["goodput_qps"] == pytest.approx(0.69, abs=0.01) and rows[0]["degraded_first"] == "ttft"
    assert rows[0]["first_ttft_p50_ms"] == pytest.approx(runs[0].steps[0].ttft_ms.p50)
    assert rows[1]["knee_tpot_p99_ms_ratio"] == pytest.approx(160.5 / 174.8, abs=0.01)  # docs/LOAD.md's runs
    text = render_table(LeverStudy(name="t", source="t.yaml", created="", study={}, table=table))
    assert text.count("\n") == 4 and "| transformers serve (no CB) |" in text


def test_prefix_reference_against_the_roofline(monkeypatch):
    import quantkit.load.levers_report as levers_report
    from quantkit.core.hardware import Device, shape_config
    from quantkit.core.roofline import Shape, prefill_flops

    monkeypatch.setattr(levers_report, "cached_probe", lambda device: Device("test", 1e10, 1e11, "test"))

    def run(label, prefix, suffix, ttft_ms):
        workload = {"shared_prefix": prefix, "prompt_len": {"low": suffix}}
        steps = [Step(offered=1, ttft_ms=Latency(p50=ttft_ms))]
        config = {"mode": "concurrency", "workload": workload}
        return LoadRun(label=label, config=config, steps=steps, levels=[], analysis=None, stopped=None)

    ref = prefix_reference("smollm2-135m", [run("off", 0, 160, 100.0), run("on", 128, 32, 40.0)])
    (row,) = ref.to_json()["levers"]
    shape = Shape.from_config(shape_config("smollm2-135m"))
    expected = 1e3 * (prefill_flops(shape, 160) - prefill_flops(shape, 32)) / 1e11
    assert row["roofline_prefix_prefill_ms"] == pytest.approx(expected)
    assert row["saved_ms"] == pytest.approx(60.0) and row["saved_vs_roofline"] == pytest.approx(60.0 / expected)
    assert row["ttft_ratio"] == pytest.approx(0.4) and 0.7 < row["prefix_share"] < 0.85
    assert row["roofline_ttft_ratio"] == pytest.approx(1 - row["prefix_share"])
    study = LeverStudy(name="t", source="t.yaml", created="", study={}, table=[], prefix_reference=ref)
    assert "| x0.40 |" in render_table(study)


@pytest.mark.parametrize("study", sorted((STUDIES).glob("levers-*.yaml")), ids=lambda p: p.name)
def test_the_shipped_studies_validate(study, tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    for name in ("QK_DEMO_F16", "QK_DEMO_Q4_0", "QK_GGUF", "QK_DRAFT_GGUF", "QK_DRAFT_MODEL"):
        monkeypatch.setenv(name, str(gguf))
    monkeypatch.setenv("QK_DEMO_MODEL", str(model))
    monkeypatch.setenv("QK_HF_MODEL", "org/model")
    result = CliRunner().invoke(cli, ["levers", str(study), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["needs_trust"] == []  # the shipped studies run without --trust-study
    plans = plan["levers"]
    assert len(plans) >= 2 and all("{port}" in " ".join(plan["command"]) for plan in plans)


def test_the_whole_process_group_is_stopped(tmp_path):
    """A server started through a wrapper (as `vllm serve` or a shell script would): its children go too."""
    pid_file = tmp_path / "child.pid"
    wrapper = [
        "{python}",
        "-c",
        "import subprocess, sys; p = subprocess.Popen([sys.executable, sys.argv[1], '--port', sys.argv[2]]); "
        "open(sys.argv[3], 'w').write(str(p.pid)); p.wait()",
        FAKE,
        "{port}",
        str(pid_file),
    ]
    study = _fake_study(tmp_path, command=wrapper, levers=[{"name": "only"}])
    data = yaml.safe_load(study.read_text())
    data["load"].update(concurrency="1", max_requests=2)
    study.write_text(yaml.safe_dump(data))
    code, _, stderr = _trusted(study, "--out", tmp_path / "o")
    assert code == 0, stderr
    run = json.loads((tmp_path / "o" / "00-only.json").read_text())
    assert _gone(run["server"]["pid"]) and _gone(int(pid_file.read_text()))


def test_how_settings_become_flags_and_body_fields():
    from quantkit.load.servers import SERVERS, StudyError, fill, lever_args

    args, body = lever_args(
        SERVERS["llama-cpp-python"], {"cache": True, "interrupt_requests": False, "n_threads": 2}, "x"
    )
    assert args == ["--cache", "true", "--interrupt_requests", "false", "--n_threads", "2"] and body == {}
    args, body = lever_args(
        SERVERS["vllm"], {"enable_prefix_caching": False, "speculative_config": {"method": "ngram"}}, "x"
    )
    assert args == ["--no-enable-prefix-caching", "--speculative-config", '{"method": "ngram"}']
    assert lever_args(SERVERS["vllm"], {"enable_prompt_tokens_details": True}, "x") == (
        ["--enable-prompt-tokens-details"],
        {},
    )
    assert lever_args(SERVERS["llama-server"], {"cache_prompt": False}, "x") == ([], {"cache_prompt": False})
    with pytest.raises(StudyError, match="llama-cpp-python has no lever 'parallel'"):
        lever_args(SERVERS["llama-cpp-python"], {"parallel": 4}, "levers[1]")
    assert fill(["{python}", "--port", "{port}", "{other}"], {"python": "py", "port": "8"}) == [
        "py",
        "--port",
        "8",
        "{other}",
    ]


@pytest.mark.parametrize("engine", ["vllm", "llama-server"])
def test_an_engine_that_is_not_installed_is_refused_before_out_is_made(tmp_path, monkeypatch, engine):
    """vLLM without its environment, llama-server without its binary: exit 2 but a `study.json`
    was left, and the same command again was refused as "an earlier study". Now nothing is made,
    and the rerun says the same line."""
    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "no-tools"))  # a build without llama-server
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    study = {"name": "s", "server": {"engine": engine, "model": str(model)}, "levers": [{"name": "base"}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "o"
    lines = []
    for _ in range(2):
        code, _, stderr = _levers(path, "--out", out)
        assert code == 2 and _count_line(stderr) == 1 and f"server.engine {engine}: " in stderr, stderr
        assert "is not installed" in stderr
        lines.append(stderr)
        assert not out.exists()
    assert lines[0] == lines[1] and "earlier study" not in lines[1]


def test_a_study_whose_first_server_never_came_up_can_be_run_again(tmp_path):
    """A server that exits before it is ready: nothing was measured, so no study.json blocks the
    same command (its log stays for the reason); a study that ran a lever keeps its guard."""
    failing = _fake_study(tmp_path, command=["{python}", "-c", "import sys; sys.exit(3)", "{port}"])
    out = tmp_path / "o"
    for _ in range(2):
        code, _, stderr = _trusted(failing, "--out", out)
        assert code == 2 and "earlier study" not in stderr, stderr
        assert not (out / "study.json").exists() and list(out.glob("*.server.log"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin client and server apart")
def test_server_and_client_are_pinned_apart(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    path = _fake_study(tmp_path, levers=[{"name": "only"}], cpus=str(cores[0]))
    data = yaml.safe_load(path.read_text())
    data["client_cpus"] = str(cores[1])
    data["load"].update(concurrency="1", max_requests=3, repeats=1)
    path.write_text(yaml.safe_dump(data))
    before = os.sched_getaffinity(0)
    code, _, stderr = _trusted(path, "--out", tmp_path / "o")
    assert code == 0, stderr
    placement = json.loads((tmp_path / "o" / "00-only.json").read_text())["cpu"]
    assert placement["server_cores"] == cores[:1] and placement["client_cores"] == cores[1:2]
    assert placement["shared_cores"] == [] and "warning" not in placement
    assert os.sched_getaffinity(0) == before  # the client's cores are given back after the study
    data["server"]["cpus"] = "99"
    path.write_text(yaml.safe_dump(data))
    code, _, stderr = _trusted(path, "--out", tmp_path / "o2")
    assert code == 2 and "cores [99] are not available" in stderr


@pytest.mark.parametrize("load", [{"concurrency": 4}, {"rate": 0.5}, {"concurrency": True}])
def test_one_level_may_be_written_as_a_number(load):
    from pydantic import ValidationError

    from quantkit.load.study import LoadSpec

    if isinstance(next(iter(load.values())), bool):  # a YAML `yes` is not a level
        with pytest.raises(ValidationError):
            LoadSpec(**load)
        return
    spec = LoadSpec(**load)
    key, value = next(iter(load.items()))
    assert getattr(spec, key) == str(value)


def test_the_engines_table_names_every_lever():
    """docs/LOAD.md's table of engines and their levers names each key a study may set."""
    from quantkit.load.servers import SERVERS

    doc = (Path(__file__).parents[1] / "docs" / "LOAD.md").read_text()
    table = doc.split("Engines and the levers each has", 1)[1].split("\n\n")[1]
    rows = {line.split("`")[1]: line for line in table.splitlines() if line.startswith("| `")}
    for name, kind in SERVERS.items():
        assert name in rows, name
        assert [key for key in kind.keys if f"`{key}`" not in rows[name]] == [], name
