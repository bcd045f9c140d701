"""llama-bench as the anchor of `quantkit bench --engine llamacpp`: its pp/tg in quantkit's units, the
ratio and the 10% flag, the exact runs it makes, and a missing tool as a note, not a failed bench."""

import json
import stat
from pathlib import Path

import pytest
from gguf_helpers import exact_json, kquant_json
from installed import llama_tool, needs_llama_cpp

from quantkit.bench import llama_bench


def _record(n_prompt, n_gen, avg_ns, depth=0):
    tokens = n_prompt or n_gen
    return {
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": depth,
        "avg_ns": avg_ns,
        "avg_ts": tokens / (avg_ns / 1e9),
        "samples_ns": [avg_ns] * 3,
        "build_commit": "0c1e570",
        "build_number": 1,
        "cpu_info": "AMD EPYC",
        "backends": "CPU",
        "n_threads": 2,
    }


def test_parse_turns_pp_and_tg_into_ttft_and_tpot():
    a = llama_bench.parse(_record(256, 0, 50_000_000), _record(0, 64, 640_000_000, depth=256))
    assert a["ttft_ms"] == pytest.approx(50.0) and a["tpot_ms"] == pytest.approx(10.0)  # 640 ms / 64 tokens
    assert a["pp_tokens_per_s"] == pytest.approx(256 / 0.05) and a["tg_tokens_per_s"] == pytest.approx(100.0)
    assert a["tg_depth"] == 256 and a["repeats"] == 3


@pytest.mark.parametrize(
    "ttft, tpot, disagree",
    [(50.0, 10.0, []), (54.9, 9.1, []), (55.1, 10.0, ["ttft"]), (50.0, 8.9, ["tpot"]), (70.0, 20.0, ["ttft", "tpot"])],
)
def test_compare_flags_what_is_beyond_ten_percent(ttft, tpot, disagree):
    figures = llama_bench.parse(_record(256, 0, 50_000_000), _record(0, 64, 640_000_000, depth=256))
    c = llama_bench.compare(ttft, tpot, {**figures, "command": "llama-bench -m m.gguf"})  # TTFT 50 ms, TPOT 10
    assert (
        list(c.disagree) == disagree
        and c.ratio_ttft == pytest.approx(ttft / 50)
        and c.ratio_tpot == pytest.approx(tpot / 10)
    )


def _fake_bench(folder: Path, log: Path) -> None:
    """A llama-bench that logs its arguments and prints one record for the test they ask for."""
    folder.mkdir()
    script = folder / "llama-bench"
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
open({str(log)!r}, "a").write(json.dumps(a) + "\\n")
p, n = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1])
d = int(a[a.index("-d") + 1]) if "-d" in a else 0
fa = int(a[a.index("-fa") + 1]) if "-fa" in a else -1
print(json.dumps([{{"n_prompt": p, "n_gen": n, "n_depth": d, "avg_ns": 1e6 * (p or n), "avg_ts": 1000.0,
                   "samples_ns": [1], "flash_attn": fa}}]))
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_measure_runs_pp_from_empty_and_tg_after_the_prompt(monkeypatch, tmp_path):
    log = tmp_path / "args.jsonl"
    _fake_bench(tmp_path / "t", log)
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    a = llama_bench.measure(tmp_path / "m.gguf", 128, 16, threads=3, repeats=4)
    pp, tg = (json.loads(line) for line in log.read_text().splitlines())
    assert pp[pp.index("-p") + 1] == "128" and pp[pp.index("-n") + 1] == "0" and "-d" not in pp
    assert tg[tg.index("-n") + 1] == "16" and tg[tg.index("-d") + 1] == "128" and tg[tg.index("-p") + 1] == "0"
    for args in (pp, tg):
        assert (
            args[args.index("-t") + 1] == "3"
            and args[args.index("-r") + 1] == "4"
            and args[args.index("-fa") + 1] == "0"
        )
        assert args[args.index("-b") + 1] == "512" and args[args.index("-o") + 1] == "json"
    assert a["ttft_ms"] == pytest.approx(128.0) and a["tpot_ms"] == pytest.approx(1.0)


def test_measure_at_a_depth_runs_tg_alone_after_it_with_the_rows_flash_attention(monkeypatch, tmp_path):
    log = tmp_path / "args.jsonl"
    _fake_bench(tmp_path / "t", log)
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    a = llama_bench.measure(tmp_path / "m.gguf", 128, 16, threads=2, repeats=3, flash_attn=True, depth=4096)
    (tg,) = (json.loads(line) for line in log.read_text().splitlines())  # no pp run: a depth's row has no TTFT
    assert tg[tg.index("-p") + 1] == "0" and tg[tg.index("-n") + 1] == "16" and tg[tg.index("-d") + 1] == "4096"
    assert tg[tg.index("-fa") + 1] == "1" and tg[tg.index("-r") + 1] == "3"
    assert a["tpot_ms"] == pytest.approx(1.0) and a["tg_depth"] == 4096 and a["flash_attn"] is True
    assert "ttft_ms" not in a and "-d 4096" in a["command"] and "-fa 1" in a["command"]
    c = llama_bench.compare(None, 1.2, a)
    assert c.ratio_ttft is None and c.ratio_tpot == pytest.approx(1.2) and c.disagree == ("tpot",)
    assert c.ttft_ms is None and "ttft_ms" not in c.to_json() and c.to_json()["ratio_ttft"] is None


@needs_llama_cpp
def test_each_depth_row_carries_llama_benchs_figure_at_its_depth(cli, tiny_llama, monkeypatch, tmp_path):
    log = tmp_path / "args.jsonl"
    _fake_bench(tmp_path / "t", log)
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    code, out, err, res = cli(
        "bench",
        str(tiny_llama),
        "--engine",
        "llamacpp",
        "--threads",
        "1",
        "--gen-len",
        "4",
        "--repeats",
        "2",
        "--min-seconds",
        "0",
        "--no-self-check",
        "--depth",
        "0,16",
        "--flash-attn",
        "on",
        "--json",
    )
    assert code == 0, err
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r[r.index("-d") + 1] for r in runs] == ["0", "16"] and all(r[r.index("-fa") + 1] == "1" for r in runs)
    for row in res["rows"]:
        a = row["anchor"]
        assert a["tg_depth"] == row["depth"] and a["flash_attn"] is True and a["tg_tokens"] == 4
        assert a["ratio_tpot"] == pytest.approx(row["tpot_ms"] / a["tpot_ms"]) and a["ratio_ttft"] is None
        # the fake's 1 ms per token is far from the tiny model's: a note names the depth
        assert a["disagree"] == ["tpot"] and any(f"ms at depth {row['depth']})" in n for n in row["notes"])


def test_measure_without_llama_bench_is_an_error_entry(monkeypatch, tmp_path):
    (tmp_path / "none").mkdir()
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "none"))
    a = llama_bench.measure(tmp_path / "m.gguf", 8, 4, threads=1, repeats=1)
    assert set(a) == {"error"} and "llama-bench is not installed" in a["error"] and "\n" not in a["error"]


@needs_llama_cpp
def test_bench_llamacpp_reports_llama_bench_beside_its_figures(cli, tiny_llama):
    llama_tool("llama-bench")
    code, _, stderr, result = cli(
        "bench",
        str(tiny_llama),
        "--engine",
        "llamacpp",
        "--prompt-len",
        "32",
        "--gen-len",
        "8",
        "--repeats",
        "2",
        "--min-seconds",
        "0",
        "--threads",
        "1",
        "--json",
    )
    assert code == 0, stderr
    row = result["rows"][0]
    a = row["anchor"]
    assert "error" not in a, a
    assert a["pp_tokens"] == 32 and a["tg_tokens"] == 8 and a["tg_depth"] == 32 and a["threads"] == 1
    assert a["ratio_ttft"] == pytest.approx(row["ttft_ms"] / a["ttft_ms"]) and a["ratio_tpot"] == pytest.approx(
        row["tpot_ms"] / a["tpot_ms"]
    )
    assert all(any(w.upper() in n for n in row["notes"]) for w in a["disagree"])  # each disagreement is a note


def test_a_lossy_gguf_has_no_self_check_reference(tmp_path):
    """llama-quantize's output is lossy by design: comparing it with the checkpoint would fail every bench."""
    from quantkit.bench.gguf_file import reference_source

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    for rec, kind in ((kquant_json(exact_json()), "Q4_K_M"), (exact_json(lossless=False), "--allow-lossy")):
        (tmp_path / "m.quantkit.json").write_text(json.dumps(rec))
        ref, why = reference_source(gguf)
        assert ref is None and why.startswith("skipped: a lossy GGUF") and kind in why
    (tmp_path / "m.quantkit.json").write_text(json.dumps({"kind": "quantkit-gguf-export", "lossless": False}))
    ref, why = reference_source(gguf)  # a record that does not read is none: nothing to compare with
    assert ref is None and why.startswith("not possible: a GGUF without quantkit's export record")
