"""quantkit run / compare / publish on tiny fixtures."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64", "--set", "eval.seq_len=64",
         "--set", "eval.max_tokens=128", "--set", "bench.prompt_len=16", "--set", "bench.gen_len=4",
         "--set", "bench.repeats=1", "--set", "bench.min_seconds=0", "--set", "bench.engine=eager"]


@pytest.fixture
def suite(tmp_path):
    p = tmp_path / "suite.yaml"
    for name in ("int4-w4a16-rtn.yaml", "int8-w8a16-gptq.yaml"):  # includes stay in the suite's directory tree
        (tmp_path / name).write_text((REPO / "recipes" / name).read_text())
    p.write_text(
        "description: test suite\n"
        "variants:\n"
        "  - name: int4-rtn\n    recipe: int4-w4a16-rtn.yaml\n"
        "  - name: int8-gptq\n    recipe: int8-w8a16-gptq.yaml\n"
    )
    return p


def test_run_report_and_reuse(cli, suite, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "run"
    args = ["run", str(suite), "--model", str(tiny_llama), "--out", str(out), "--calib", f"file:{tiny_text}",
            "--eval-text", f"file:{tiny_text}", *SMALL, "--json"]
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
    card = (out / "artifacts" / "int4-rtn" / "README.md").read_text()
    assert "KL divergence vs baseline" in card and "TPOT (batch 1)" in card
    # the figures agree with quantkit eval run by hand
    code, _, err, ev = cli("eval", str(out / "artifacts" / "int4-rtn"), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}",
                           "--seq-len", "64", "--max-tokens", "128", "--json")
    assert ev["kld"]["mean"] == pytest.approx(rep["rows"][1]["kld_mean"], rel=1e-6)
    # a second run reuses every step
    code, _, err, rep2 = cli(*args)
    assert code == 0, err
    assert "reusing" in err
    assert rep2["rows"][1]["tpot_ms"] == rep["rows"][1]["tpot_ms"]
    assert sum(rep2["timings"].values()) < sum(rep["timings"].values())


def test_failed_variant_reported_others_go_on(cli, tiny_llama, tiny_text, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("variants:\n  - name: ok\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n"
                 "  - name: bad\n    steps:\n      - quantize: {method: gptq, group_size: 64}\n")
    code, out, err, _ = cli("run", str(p), "--model", str(tiny_llama), "--out", str(tmp_path / "r"), *SMALL, "--skip-bench")
    assert code == 1
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    status = {r["name"]: r["status"] for r in rep["rows"]}
    assert status == {"baseline": "ok", "ok": "ok", "bad": "failed"}
    assert "needs calibration text" in rep["variants"]["bad"]["error"]


def test_bench_failure_fails_its_variant(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.bench.runner as runner

    real = runner.bench_one

    def bench_one(path, s, figs):
        if Path(path).name == "int4":
            raise runner.QuantkitError("no kernel for this scheme on cpu")
        return real(path, s, figs)

    monkeypatch.setattr(runner, "bench_one", bench_one)
    p = tmp_path / "s.yaml"
    p.write_text("variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn, group_size: 64}\n")
    code, out, err, _ = cli("run", str(p), "--model", str(tiny_llama), "--out", str(tmp_path / "r"), *SMALL, "--skip-eval")
    assert code == 1
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    status = {r["name"]: r["status"] for r in rep["rows"]}
    assert status == {"baseline": "ok", "int4": "failed"} and rep["failed"] == ["int4"]
    assert rep["variants"]["int4"]["error"] == "bench: no kernel for this scheme on cpu"
    assert "- int4: bench: no kernel for this scheme on cpu" in (tmp_path / "r" / "report.md").read_text()
    assert "int4: bench: no kernel" in out


def test_compare_two_runs(cli, tmp_path):
    def fake(name, tpot):
        d = tmp_path / name
        d.mkdir()
        rows = [{"name": "fp16", "tpot_ms": tpot, "delta_ppl_pct": 0.0, "kld_mean": 0.0, "status": "ok"},
                {"name": "int4", "tpot_ms": tpot / 2, "delta_ppl_pct": 5.0, "kld_mean": 0.1, "status": "ok"}]
        (d / "report.json").write_text(json.dumps({"kind": "quantkit-run", "recipe": "demo", "date": "d", "host": "h",
                                                   "device": {"name": "cpu"}, "fit": None, "rows": rows}))
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


@pytest.fixture
def artifact(cli, tiny_llama, tmp_path):
    out = tmp_path / "art"
    code, _, err, _ = cli("convert", str(REPO / "recipes" / "int4-w4a16-rtn.yaml"), "--model", str(tiny_llama), "--out", str(out), "--json")
    assert code == 0, err
    return out


def test_publish_dry_run(cli, artifact, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    code, out, err, data = cli("publish", str(artifact), "--repo", "me/tiny-int4", "--dry-run", "--json")
    assert code == 0, err
    paths = {f["path"] for f in data["files"]}
    assert {"config.json", "model.safetensors", "README.md", "quantkit.json"} <= paths
    assert "base_model_relation: quantized" in data["card"]
    assert "hf_secret_token_value" not in out + err


def test_publish_refuses_unverified(cli, artifact):
    meta = json.loads((artifact / "quantkit.json").read_text())
    meta["verification"]["status"] = "failed"
    (artifact / "quantkit.json").write_text(json.dumps(meta))
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x", "--dry-run")
    assert code == 2 and "unverified" in err


def test_publish_call_boundary(artifact, monkeypatch, tmp_path):
    """The upload goes through huggingface_hub's HfApi with the token from HF_TOKEN, never written anywhere."""
    from quantkit import publish

    calls = []

    class FakeApi:
        def create_repo(self, repo, **kw):
            calls.append(("create_repo", repo, kw))

        def create_branch(self, repo, **kw):
            calls.append(("create_branch", repo, kw))

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw))

            class Info:
                commit_url = "https://huggingface.co/me/x/commit/abc"

            return Info()

    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    result = publish.publish(artifact, "me/x", private=True, revision="v1", api=FakeApi())
    assert calls[0] == ("create_repo", "me/x", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[1][0] == "create_branch" and calls[2][1]["folder_path"] == str(artifact) and calls[2][1]["revision"] == "v1"
    assert result["commit_url"].endswith("abc")
    for f in artifact.rglob("*"):
        if f.is_file():
            assert b"hf_secret_token_value" not in f.read_bytes()


def test_publish_without_token(cli, artifact, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x")
    assert code == 2 and "HF_TOKEN" in err


def test_publish_offline_is_clear(cli, artifact, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: like being offline
    code, _, err, _ = cli("publish", str(artifact), "--repo", "me/x")
    assert code == 2 and ("cannot reach" in err or "refused" in err) and "hf_x" not in err


def test_run_gqa_variants(cli, tiny_dir, tiny_text, tmp_path):
    """GQA alone and GQA then RTN in one variant, next to the baseline: the KV column follows the KV heads."""
    p = tmp_path / "gqa-suite.yaml"
    gqa = "      - gqa: {kv_heads: 1, grouping: contiguous, merge: calibrated, recover: null}\n"
    p.write_text("variants:\n  - name: fp16\n    baseline: true\n"
                 "  - name: gqa\n    steps:\n" + gqa +
                 "  - name: gqa-rtn\n    steps:\n" + gqa + "      - quantize: {method: rtn, group_size: 64}\n")
    out = tmp_path / "run"
    code, _, err, rep = cli("run", str(p), "--model", str(tiny_dir / "llama-mha"), "--out", str(out), "--calib", f"file:{tiny_text}",
                            "--eval-text", f"file:{tiny_text}", *SMALL, "--json")
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
