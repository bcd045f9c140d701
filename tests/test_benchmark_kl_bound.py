"""benchmarks/kl_bound.py on tiny models: the exact KL and the top-256 bound of each variant on each
text, both labelled, the bound never above the exact KL, their times, and a docs table."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import render  # noqa: E402


def test_the_kl_bound_benchmark_scores_each_variant_both_ways(tiny_dir, tiny_text, tmp_path):
    from fixtures import build_checkpoint

    base = tiny_dir / "llama-gqa"
    other = build_checkpoint(tmp_path / "other", "llama-gqa", tiny_dir / "tokenizer", seed=1)
    variants = [f"other={other}"] + ([f"f16={base}:llamacpp"] if importlib.util.find_spec("llama_cpp") else [])
    args = [*("--model", str(base), "--text", f"file:{tiny_text}", "--split", "all", "--seq-len", "32")]
    args += ["--max-tokens", "96", "--results", str(tmp_path / "results"), "--name", "kl-bound-tiny"]
    args += [x for v in variants for x in ("--variant", v)]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "kl_bound.py"), *args], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "results" / "kl-bound-tiny.json").read_text())
    assert result["benchmark"] == "kl-bound-tiny" and result["command"].startswith("python")
    rows = result["rows"]
    assert [(r["variant"], r["domain"]) for r in rows] == [(v.split("=")[0], "text") for v in variants]
    for r in rows:
        assert r["kl_kinds"] == ["exact", "topk-256 lower bound"] and r["tokens"] == 3 * 31
        assert 0 <= r["bound"] <= r["exact"] and r["short_pct"] >= 0
        assert r["exact_s"] > 0 and r["bound_s"] > 0 and r["cost"] > 0
    assert rows[0]["exact"] > 0.01 and rows[0]["short_pct"] > 0  # a 384-token vocabulary: the bound falls short
    table = render.table(result, "main")
    assert table.startswith("| variant | engine | domain | KL exact | 95% CI | KL top-256 bound |")
    assert f"| `other` | transformers | text | {rows[0]['exact']:.4f} |" in table
