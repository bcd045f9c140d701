"""benchmarks/depth.py on a tiny model at tiny depths: one `quantkit bench --depth` per engine in one
run, a row per engine, depth (and llama.cpp's flash-attention setting), the fits, a docs table."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import render  # noqa: E402


def test_the_depth_benchmark_runs_every_engine_and_writes_its_table(tiny_llama, tmp_path):
    engines = ["eager"] + (["llamacpp"] if importlib.util.find_spec("llama_cpp") else [])
    args = [
        *("--out", str(tmp_path / "run"), "--model", str(tiny_llama), "--engines", ",".join(engines)),
        *("--depths", "0,16", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--threads", "1"),
        *("--results", str(tmp_path / "results")),
    ]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "depth.py"), *args], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "results" / "depth.json").read_text())
    assert result["benchmark"] == "depth" and result["depths"] == [0, 16] and result["command"].startswith("python")
    want = [("eager", "-", d) for d in (0, 16)] + [("llamacpp", fa, d) for fa in ("off", "on") for d in (0, 16)][
        : 4 * (len(engines) - 1)
    ]
    assert [(r["engine"], r["flash_attn"], r["depth"]) for r in result["rows"]] == want
    assert all(r["tpot_ms"] > 0 and r["repeats"] >= 1 for r in result["rows"])
    assert set(result["fits"]) == set(engines) and all(
        result["fits"][e]["points"] == len([r for r in result["benches"][e]["rows"] if not r["disturbed"]])
        for e in engines
    )
    for e in engines:
        assert (tmp_path / "run" / f"{e}.json").is_file() and (tmp_path / "run" / f"{e}-depth.png").is_file()
    table = render.table(result, "main")
    assert table.startswith("| engine | variant | flash attn | depth |")
    assert any(line.startswith("| eager |") and "| - | 16 |" in line for line in table.splitlines())
