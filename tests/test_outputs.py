"""The one output rule (core/outputs.py) and every writing command going through it before any
work: never an input or inside one, never inside an artifact or quantkit's cache, never over a file
quantkit did not write (--force for the rest), plots as PNG, a directory of its own for a front."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.bench.bench_records import BenchResult
from quantkit.core.outputs import Output, check_dir, check_files, made_above, save_png, written_png
from quantkit.errors import QuantkitError

V2 = Path(__file__).with_name("bench_v2.json")  # a bench result as quantkit wrote it (schema 2)


@pytest.fixture
def model(tmp_path) -> Path:
    """A model directory with a symlinked weight file (as a hub cache lays one out)."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"weights")
    m = tmp_path / "models" / "model"
    m.mkdir(parents=True)
    (m / "config.json").write_text("{}")
    (m / "model.safetensors").symlink_to(blobs / "abc")
    return m


def _inputs(*paths):
    from quantkit.core.outputs import model_inputs

    return model_inputs(paths)


def _png(path: Path, marked: bool = True) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    if marked:
        save_png(fig, path, dpi=20)
    else:
        fig.savefig(path, dpi=20)
    return path


@pytest.mark.parametrize(
    "where, says",
    [
        (lambda m, t: m / "model.safetensors", "is a file of the model"),
        (lambda m, t: m / "config.json", "lies inside a model this command reads"),
        (lambda m, t: m / "sub" / "res.json", "lies inside"),
        (lambda m, t: t / "blobs" / "abc", "is a file of the model"),
        (lambda m, t: t / "art" / "res.json", "inside a quantkit artifact"),
        (lambda m, t: t / "art" / "deeper" / "res.json", "inside a quantkit artifact"),
        (lambda m, t: t / "qk-home" / "res.json", "quantkit's cache"),
        (lambda m, t: t / "link.json", "symbolic link"),
        (lambda m, t: t, "is a directory"),
        (lambda m, t: t / "afile" / "res.json", "is not a directory"),
    ],
)
def test_a_file_output_is_never_an_input_nor_inside_one(model, tmp_path, where, says):
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "quantkit.json").write_text("{}")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if not p.is_symlink()}
    with pytest.raises(QuantkitError, match=says):
        check_files([Output(where(model, tmp_path), "--out", "json", ("bench",))], inputs=_inputs(model), force=True)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if not p.is_symlink()} == before


def test_a_gguf_input_and_the_artifact_it_lies_in(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    (art / "quantkit.json").write_text("{}")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(QuantkitError, match="is a model this command reads"):
        check_files([Output(gguf, "--out")], inputs=_inputs(gguf), force=True)
    with pytest.raises(QuantkitError, match="inside a quantkit artifact"):
        check_files([Output(art / "m.gguf.png", "--plot", "png")], force=True)


def test_existing_files_need_force_and_force_replaces_only_quantkits(tmp_path):
    ours = tmp_path / "res.json"
    ours.write_text(json.dumps({"kind": "bench"}))
    other_kind = tmp_path / "run.json"
    other_kind.write_text(json.dumps({"kind": "load-run"}))
    users = tmp_path / "notes.json"
    users.write_text('{"my": "notes"}')
    garbage = tmp_path / "bin.json"
    garbage.write_bytes(os.urandom(64))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    bench = ("bench",)
    for p in (ours, users):
        with pytest.raises(QuantkitError, match="already exists; pass --force"):
            check_files([Output(p, "--out", "json", bench)])
    check_files([Output(ours, "--out", "json", bench)], force=True)
    for p in (other_kind, users, garbage, deep):
        with pytest.raises(QuantkitError, match="is not a quantkit result of kind bench"):
            check_files([Output(p, "--out", "json", bench)], force=True)
    marked, plain = _png(tmp_path / "ours.png"), _png(tmp_path / "theirs.png", marked=False)
    assert written_png(marked) and not written_png(plain) and not written_png(ours)
    check_files([Output(marked, "--plot", "png")], force=True)
    with pytest.raises(QuantkitError, match="is not a PNG quantkit wrote"):
        check_files([Output(plain, "--plot", "png")], force=True)


@pytest.mark.parametrize("name", ["plot.txt", "plot.pdf", "plot", "plot.png.json"])
def test_a_plot_is_a_png(tmp_path, name):
    with pytest.raises(QuantkitError, match="a plot is written as PNG"):
        check_files([Output(tmp_path / name, "--plot", "png")])


def test_two_outputs_of_one_command_are_two_files(tmp_path):
    with pytest.raises(QuantkitError, match="give each output its own path"):
        check_files(
            [Output(tmp_path / "a.png", "--plot", "png"), Output(tmp_path / "a.png", "--plot (with --sweep)", "png")]
        )


def test_a_new_file_in_a_missing_directory_is_fine(tmp_path):
    check_files([Output(tmp_path / "new" / "dir" / "res.json", "--out")])


@pytest.mark.parametrize(
    "where, says",
    [
        (lambda m, t: Path("/"), "root, home or current"),
        (lambda m, t: Path.home(), "root, home or current"),
        (lambda m, t: Path("."), "root, home or current"),
        (lambda m, t: Path(".."), "root, home or current"),
        (lambda m, t: m, "is a model"),
        (lambda m, t: m.parent, "contains a model"),
        (lambda m, t: m / "front", "lies inside a model"),
        (lambda m, t: t / "art" / "front", "inside a quantkit artifact"),
        (lambda m, t: t / "run" / "artifacts" / "x" / "front", "inside a quantkit artifact"),
        (lambda m, t: t / "run" / "front", "inside a run directory"),
        (lambda m, t: t / "other" / "front", "inside a front"),
        (lambda m, t: t / "full", "is not empty and is not a front quantkit made"),
        (lambda m, t: t / "afile", "is not a directory"),
    ],
)
def test_a_directory_output_is_one_of_its_own(model, tmp_path, monkeypatch, where, says):
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "quantkit.json").write_text("{}")
    (tmp_path / "run" / "artifacts" / "x").mkdir(parents=True)
    (tmp_path / "run" / "steps.json").write_text("{}")
    (tmp_path / "run" / "artifacts" / "x" / "quantkit.json").write_text("{}")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pareto.json").write_text("{}")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "pareto.md").write_text("mine")
    (tmp_path / "afile").write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(QuantkitError, match=says):
        check_dir(where(model, tmp_path), "--out", inputs=_inputs(model), made=lambda p: False, what="a front")


def test_a_directory_output_may_be_new_empty_or_made(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "made").mkdir()
    (tmp_path / "made" / "pareto.md").write_text("ours")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / ".pareto.json.lock").write_text("123")  # quantkit's own lock, taken before the check
    for d in ("new", "empty", "made", "locked"):
        check_dir(tmp_path / d, "--out", made=lambda p: p.name == "made", what="a front")
    assert made_above(tmp_path / "made") is None


# ---- every writing command checks before any work --------------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Any measurement or plot fails the test: a refusal comes before them."""

    def boom(*a, **k):
        raise AssertionError("work started before the output check")

    monkeypatch.setattr("quantkit.bench.bench_runner.bench_many", boom)
    monkeypatch.setattr("quantkit.bench.probe.run_probe", boom)
    monkeypatch.setattr("quantkit.load.load_steps.run", boom)
    monkeypatch.setattr("quantkit.pipeline.pareto.run_pareto", boom)
    monkeypatch.setattr("quantkit.cli.compare_cmd.plot_tpot", boom)


def _report(d: Path) -> Path:
    d.mkdir()
    (d / "report.json").write_text(
        json.dumps({"kind": "quantkit-run", "schema_version": 2, "recipe": "r", "date": "d", "host": "h", "rows": []})
    )
    return d


@pytest.mark.parametrize(
    "command",
    [
        lambda m, t: ["bench", str(m), "--out", str(m / "model.safetensors")],
        lambda m, t: ["bench", str(m), "--out", str(m / "config.json"), "--force"],
        lambda m, t: ["bench", str(m), "--plot", str(t / "plot.txt"), "--out", str(t / "res.json")],
        lambda m, t: ["bench", str(m), "--plot", str(t / "p.png"), "--sweep", "4,8", "--out", str(t / "p-ttft.png")],
        lambda m, t: ["bench", str(m), "--plot", str(t / "art" / "p.png"), "--probe"],
        lambda m, t: ["bench", str(m), "--plan", "--out", str(t / "art" / "quantkit.json"), "--force"],
        lambda m, t: ["compare", str(t / "r1"), str(t / "r2"), "--plot", str(t / "r1" / "report.json")],
        lambda m, t: ["compare", str(t / "r1"), str(t / "r2"), "--plot", str(t / "art" / "c.png")],
        lambda m, t: ["load", "http://127.0.0.1:9/v1", "--model", "m", "--out", str(t / "art" / "run.json")],
        lambda m, t: ["load", "http://127.0.0.1:9/v1", "--model", "m", "--plot", str(t / "run.svg")],
        lambda m, t: ["pareto", str(m), "--calib", "self", "--out", str(t / "art" / "front")],
        lambda m, t: ["pareto", str(m), "--calib", "self", "--out", str(m.parent)],
        lambda m, t: ["pareto", str(m), "--calib", "self", "--out", str(t / "r1")],
    ],
)
def test_every_writing_command_refuses_before_any_work(tiny_llama, tmp_path, no_work, command):
    import shutil

    from quantkit.cli import cli as group

    m = tmp_path / "models" / "llama"
    shutil.copytree(tiny_llama, m)
    art = tmp_path / "art"
    art.mkdir()
    (art / "quantkit.json").write_text("{}")
    for r in ("r1", "r2"):
        _report(tmp_path / r)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    res = CliRunner().invoke(group, command(m, tmp_path), catch_exceptions=False)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output
    after = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert after == before  # nothing written, nothing replaced


def test_a_plot_that_fails_after_the_work_keeps_the_measurement(tiny_llama, tmp_path, monkeypatch):
    from quantkit.cli import cli as group

    result = replace(BenchResult.from_json(json.loads(V2.read_text())), failed=())
    monkeypatch.setattr("quantkit.bench.bench_runner.bench_many", lambda *a, **k: result)

    def fails(*a, **k):
        raise ValueError("Format 'png' is not supported (a library fault)")

    monkeypatch.setattr("quantkit.pipeline.plots.rule_check", fails)
    out, plot = tmp_path / "res.json", tmp_path / "rule.png"
    res = CliRunner().invoke(group, ["bench", str(tiny_llama), "--out", str(out), "--plot", str(plot)])
    assert res.exit_code == 1, res.output
    assert res.stderr.strip().splitlines()[-1].startswith("error: --plot") and "the measurement is kept" in res.stderr
    kept = BenchResult.from_json(json.loads(out.read_text()))
    assert [r.tpot_ms for r in kept.rows] == [r.tpot_ms for r in result.rows] and kept.plot is None
    assert not plot.exists()


def test_bench_rewrites_its_own_result_with_force(tiny_llama, tmp_path, monkeypatch):
    from quantkit.cli import cli as group

    result = replace(BenchResult.from_json(json.loads(V2.read_text())), failed=())
    monkeypatch.setattr("quantkit.bench.bench_runner.bench_many", lambda *a, **k: result)
    out, plot = tmp_path / "res.json", tmp_path / "rule.png"
    args = ["bench", str(tiny_llama), "--out", str(out), "--plot", str(plot), "--json"]
    assert CliRunner().invoke(group, args).exit_code == 0
    assert written_png(plot) and json.loads(out.read_text())["plot"] == str(plot)
    again = CliRunner().invoke(group, args)
    assert again.exit_code == 2 and "already exists; pass --force" in again.stderr
    assert CliRunner().invoke(group, [*args, "--force"]).exit_code == 0
