"""quantkit run / compare / publish on tiny fixtures."""

import json
import shutil
from pathlib import Path

import pytest
from fixtures import RECIPES

from quantkit.pipeline.report import render_markdown
from quantkit.pipeline.report_content import ReportContent

SMALL = [
    "--set",
    "calibration.samples=4",
    "--set",
    "calibration.seq_len=64",
    "--set",
    "eval.seq_len=64",
    "--set",
    "eval.max_tokens=128",
    "--set",
    "bench.prompt_len=16",
    "--set",
    "bench.gen_len=4",
    "--set",
    "bench.repeats=1",
    "--set",
    "bench.min_seconds=0",
    "--set",
    "bench.engine=eager",
]


@pytest.fixture
def suite(tmp_path):
    p = tmp_path / "suite.yaml"
    for name in ("int4-w4a16-rtn.yaml", "int8-w8a16-gptq.yaml"):  # includes stay in the suite's directory tree
        (tmp_path / name).write_text((RECIPES / name).read_text())
    p.write_text(
        "description: test suite\n"
        "variants:\n"
        "  - name: int4-rtn\n    recipe: int4-w4a16-rtn.yaml\n"
        "  - name: int8-gptq\n    recipe: int8-w8a16-gptq.yaml\n"
    )
    return p


def test_run_report_and_reuse(cli, suite, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        str(suite),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--eval-text",
        f"file:{tiny_text}",
        *SMALL,
        "--json",
    ]
    code, _, err, rep = cli(*args)
    assert code == 0, err
    names = [r["name"] for r in rep["rows"]]
    assert names == ["baseline", "int4-rtn", "int8-gptq"]
    for r in rep["rows"]:
        assert r["status"] == "ok" and r["tpot_ms"] > 0 and r["kld_mean"] is not None and r["bits_per_weight"] > 0
    base = rep["rows"][0]
    assert base["kld_mean"] == 0.0 and base["bits_per_weight"] == pytest.approx(16.0)
    assert rep["rows"][1]["bits_per_weight"] == pytest.approx(4.25, abs=0.01)
    assert (out / "report.md").is_file() and (out / "report.json").is_file()
    assert (out / "plots" / "rule_check.png").is_file() and (out / "plots" / "accuracy_vs_tpot.png").is_file()
    md = (out / "report.md").read_text()
    assert "| variant | size MB | bits/weight | KV B/token | TTFT ms | TPOT ms | pred TPOT ms |" in md
    bench_line = next(line for line in md.splitlines() if line.startswith("- eval:"))
    assert "{" not in bench_line and "-token prompt" in bench_line  # the settings in words, not a dict
    written = json.loads((out / "report.json").read_text())
    content = ReportContent.from_json(written)  # report.json is one record: its JSON back, report.md from it
    assert content.to_json() == written and render_markdown(content) == md
    assert content.rows[1]["name"] == "int4-rtn" and content.bench_settings.gen_len == 4
    card = (out / "artifacts" / "int4-rtn" / "README.md").read_text()
    assert "KL divergence vs baseline" in card and "TPOT (batch 1)" in card
    # the figures agree with quantkit eval run by hand
    code, _, err, ev = cli(
        "eval",
        str(out / "artifacts" / "int4-rtn"),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        "--json",
    )
    assert ev["kld"]["mean"] == pytest.approx(rep["rows"][1]["kld_mean"], rel=1e-6)
    # a second run reuses every step
    code, _, err, rep2 = cli(*args)
    assert code == 0, err
    assert "reusing" in err
    assert rep2["rows"][1]["tpot_ms"] == rep["rows"][1]["tpot_ms"]
    assert sum(rep2["timings"].values()) < sum(rep["timings"].values())


def test_failed_variant_reported_others_go_on(cli, tiny_llama, tiny_text, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        "variants:\n  - name: ok\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n"
        "  - name: bad\n    steps:\n      - quantize: {method: gptq, group_size: 64}\n"
    )
    code, out, err, _ = cli(
        "run", str(p), "--model", str(tiny_llama), "--out", str(tmp_path / "r"), *SMALL, "--skip-bench"
    )
    assert code == 1
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    status = {r["name"]: r["status"] for r in rep["rows"]}
    assert status == {"baseline": "ok", "ok": "ok", "bad": "failed"}
    assert "needs calibration text" in rep["variants"]["bad"]["error"]


def test_bench_failure_fails_its_variant(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.bench.bench_runner as runner

    real = runner.bench_one

    def bench_one(path, s, figs, cache=None, twins=None, precision=None):
        if Path(path).name == "int4":
            raise runner.QuantkitError("no kernel for this scheme on cpu")
        return real(path, s, figs, cache, twins, precision)

    monkeypatch.setattr(runner, "bench_one", bench_one)
    p = tmp_path / "s.yaml"
    p.write_text("variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n")
    code, out, err, _ = cli(
        "run", str(p), "--model", str(tiny_llama), "--out", str(tmp_path / "r"), *SMALL, "--skip-eval"
    )
    assert code == 1
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    status = {r["name"]: r["status"] for r in rep["rows"]}
    assert status == {"baseline": "ok", "int4": "failed"} and rep["failed"] == ["int4"]
    assert rep["variants"]["int4"]["error"] == "bench: no kernel for this scheme on cpu"
    assert "- int4: bench: no kernel for this scheme on cpu" in (tmp_path / "r" / "report.md").read_text()
    assert "int4: bench: no kernel" in out


def test_a_runs_bench_section_reaches_the_bench_whole(cli, tiny_llama, tmp_path):
    """`bench: {threads, warmups, self_check}` in a suite: the bench inside `quantkit run` builds the
    same BenchSettings as `quantkit bench` (BenchSettings.from_recipe), so none is dropped."""
    import torch

    p = tmp_path / "s.yaml"
    p.write_text(
        "variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n"
        "bench: {threads: 1, warmups: 0, self_check: false}\n"
    )
    threads = torch.get_num_threads()
    try:
        code, _, err, rep = cli(
            "run", str(p), "--model", str(tiny_llama), "--out", str(tmp_path / "r"), *SMALL, "--skip-eval", "--json"
        )
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err
    for name in ("baseline", "int4"):
        row = rep["variants"][name]["bench"]
        assert row["threads"] == 1 and row["engine_info"]["threads"] == 1, name
        assert row["warmups"] == 0 and row["warmups_requested"] == 0 and row["stats"]["warmups"] == 0, name
        assert row["self_check"] == {"status": "skipped", "reason": "--no-self-check"}, name
    settings = rep["engines"]["eager"]["settings"]
    assert (settings["threads"], settings["warmups"], settings["self_check"]) == (1, 0, False)
    assert rep["bench_settings"]["threads"] == 1


def test_compare_two_runs(cli, tmp_path):
    def fake(name, tpot):
        d = tmp_path / name
        d.mkdir()
        rows = [
            {"name": "fp16", "tpot_ms": tpot, "delta_ppl_pct": 0.0, "kld_mean": 0.0, "status": "ok"},
            {"name": "int4", "tpot_ms": tpot / 2, "delta_ppl_pct": 5.0, "kld_mean": 0.1, "status": "ok"},
        ]
        (d / "report.json").write_text(
            json.dumps(
                {
                    "kind": "quantkit-run",
                    "recipe": "demo",
                    "date": "d",
                    "host": "h",
                    "device": {"name": "cpu"},
                    "fit": None,
                    "rows": rows,
                }
            )
        )
        return d

    a, b = fake("cpu-run", 40.0), fake("gpu-run", 4.0)
    code, _, err, data = cli("compare", str(a), str(b), "--json")
    assert code == 0, err
    v = {x["variant"]: x for x in data["variants"]}
    assert v["int4"]["cpu-run"]["tpot_ms"] == 20.0 and v["int4"]["gpu-run"]["tpot_ms"] == 2.0
    code, out, _, _ = cli("compare", str(a), str(b), "--plot", str(tmp_path / "c.png"))
    assert code == 0 and "| int4 |" in out and (tmp_path / "c.png").is_file()
    code, _, err, _ = cli("compare", str(tmp_path / "nope"))
    assert code == 2 and "not a run directory" in err


def test_run_gqa_variants(cli, tiny_dir, tiny_text, tmp_path):
    """GQA alone and GQA then RTN in one variant, next to the baseline: the KV column follows the KV heads."""
    p = tmp_path / "gqa-suite.yaml"
    gqa = "      - gqa: {kv_heads: 1, grouping: contiguous, merge: calibrated, recover: null}\n"
    p.write_text(
        "variants:\n  - name: fp16\n    baseline: true\n"
        "  - name: gqa\n    steps:\n"
        + gqa
        + "  - name: gqa-rtn\n    steps:\n"
        + gqa
        + "      - quantize: {method: rtn, group_size: 64}\n"
    )
    out = tmp_path / "run"
    code, _, err, rep = cli(
        "run",
        str(p),
        "--model",
        str(tiny_dir / "llama-mha"),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--eval-text",
        f"file:{tiny_text}",
        *SMALL,
        "--json",
    )
    assert code == 0, err
    rows = {r["name"]: r for r in rep["rows"]}
    assert list(rows) == ["fp16", "gqa", "gqa-rtn"] and all(r["status"] == "ok" for r in rows.values())
    base = rows["fp16"]["kv_bytes_per_token"]
    for name in ("gqa", "gqa-rtn"):
        art = out / "artifacts" / name
        g = json.loads((art / "quantkit.json").read_text())["gqa"]
        assert (g["kv_heads_before"], g["kv_heads_after"]) == (4, 1)
        assert rows[name]["kv_bytes_per_token"] == base * g["kv_heads_after"] // g["kv_heads_before"]
        assert rep["variants"][name]["bench"]["kv_bytes_per_token"] == rows[name]["kv_bytes_per_token"]
        assert rows[name]["kld_mean"] > 0 and rows[name]["tpot_ms"] > 0
        cfg = json.loads((art / "config.json").read_text())
        assert cfg["num_key_value_heads"] == 1
        assert ("quantization_config" in cfg) == (name == "gqa-rtn")
    assert rows["gqa-rtn"]["bits_per_weight"] == pytest.approx(4.25, abs=0.01)
    md = (out / "report.md").read_text()
    for name in rows:
        assert sum(line.startswith(f"| {name} | ") for line in md.splitlines()) == 1
    assert f"| {base // 4:,} |" in md


def _rtn_suite(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n")
    return p


def test_damaged_records_redo_their_step(cli, tiny_llama, tiny_text, tmp_path):
    """An emptied or garbled steps.json, an emptied artifact quantkit.json, truncated weights: each
    step is done again, with a note; the run never aborts (and never rewrites an artifact in place)."""
    from quantkit.core.integrity import check
    from quantkit.pipeline.run_report import read_report

    out = tmp_path / "r"
    args = [
        "run",
        str(_rtn_suite(tmp_path)),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--eval-text",
        f"file:{tiny_text}",
        *SMALL,
        "--skip-bench",
        "--json",
    ]
    code, _, err, rep = cli(*args)
    assert code == 0, err
    art = out / "artifacts" / "int4"
    meta = json.loads((art / "quantkit.json").read_text())
    assert meta["run_key"]
    check(art, meta)  # the run's key and the card's results went in without breaking the sha256 manifest
    kld = rep["rows"][1]["kld_mean"]
    read_report(json.loads((out / "report.json").read_text()), "report.json")  # compare reads what a run writes

    def steps_not_object():
        (out / "steps.json").write_text("[1, 2]")

    def step_record_damaged():
        data = json.loads((out / "steps.json").read_text())
        (out / "steps.json").write_text(json.dumps({k: "garbage" for k in data}))

    def stored_eval(edit):
        def damage():
            data = json.loads((out / "steps.json").read_text())
            for rec in data.values():
                if rec.get("kind") == "quantkit-eval":
                    edit(rec["texts"][0]["kld"])
            (out / "steps.json").write_text(json.dumps(data))

        return damage

    redo = "the stored result does not read"
    damages = {
        "a negative KL": (stored_eval(lambda k: k.__setitem__("mean", -0.5)), redo, "eval"),
        "a KL that is null": (stored_eval(lambda k: k.__setitem__("mean", None)), redo, "eval"),
        "emptied steps.json": (lambda: (out / "steps.json").write_text(""), "steps.json is damaged", "eval"),
        "binary steps.json": (
            lambda: (out / "steps.json").write_bytes(b"\x00\xff\xfe{"),
            "steps.json is damaged",
            "eval",
        ),
        "steps.json not an object": (steps_not_object, "steps.json is damaged", "eval"),
        "a damaged step record": (step_record_damaged, "", "eval"),
        "emptied quantkit.json": (
            lambda: (art / "quantkit.json").write_text(""),
            "is damaged (not valid JSON): converting again",
            "convert",
        ),
        "truncated weights": (
            lambda: (art / "model.safetensors").write_bytes((art / "model.safetensors").read_bytes()[:-7]),
            "model.safetensors",
            "convert",
        ),
    }
    for name, (damage, note, redone) in damages.items():
        damage()
        code, _, err, rep = cli(*args)
        assert code == 0 and note in err, (name, err)
        assert f"[int4] {redone}\n" in err and f"[int4] {redone}: reusing" not in err, (name, err)
        assert all(r["status"] == "ok" for r in rep["rows"]) and rep["rows"][1]["kld_mean"] == pytest.approx(
            kld, rel=1e-6
        ), name
        check(art, json.loads((art / "quantkit.json").read_text()))


def test_run_directory_is_locked(cli, tiny_llama, tmp_path):
    from quantkit.core.atomic import exclusive

    out = tmp_path / "r"
    with exclusive(out):
        code, _, err, _ = cli(
            "run",
            str(_rtn_suite(tmp_path)),
            "--model",
            str(tiny_llama),
            "--out",
            str(out),
            *SMALL,
            "--skip-eval",
            "--skip-bench",
        )
    assert code == 2 and "in use by another quantkit process" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_run_never_replaces_its_source(cli, tiny_llama, tmp_path):
    """A source checkpoint sitting where a variant's artifact would go (inside the run directory)
    is refused at once, in one line, not replaced, and nothing is written."""
    out = tmp_path / "r"
    src = out / "artifacts" / "int4"
    shutil.copytree(tiny_llama, src)
    (src / "quantkit.json").write_text("{}")  # even one that looks like an artifact
    before = sorted((p.name, p.read_bytes()) for p in src.iterdir())
    code, _, err, _ = cli(
        "run", str(_rtn_suite(tmp_path)), "--model", str(src), "--out", str(out), *SMALL, "--skip-eval", "--skip-bench"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "contains the source checkpoint" in err, err
    assert sorted((p.name, p.read_bytes()) for p in src.iterdir()) == before
    assert sorted(p.name for p in out.iterdir()) == ["artifacts"]  # no steps.json, no report


def test_run_out_is_a_file(cli, tiny_llama, tmp_path):
    f = tmp_path / "r"
    f.write_text("mine")
    code, _, err, _ = cli(
        "run", str(_rtn_suite(tmp_path)), "--model", str(tiny_llama), "--out", str(f), "--skip-eval", "--skip-bench"
    )
    assert code == 2 and f.read_text() == "mine"
