"""benchmarks/peer_agreement.py: AIPerf's per-request records read as quantkit counts them (the
profiling phase only, errors apart, output tokens over first send to last end), and the per-level
comparison (within 10% or not, a P99 difference with its interval), on records made by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import peer_agreement  # noqa: E402


def _record(phase, start_s, end_s, ttft, itl, tokens=16, error=None):
    out = {
        "metadata": {
            "benchmark_phase": phase,
            "request_start_ns": int(start_s * 1e9),
            "request_end_ns": int(end_s * 1e9),
        },
        "metrics": {
            "time_to_first_token": {"value": ttft},
            "inter_token_latency": {"value": itl},
            "output_sequence_length": {"value": tokens},
        },
    }
    if error:
        out["error"] = error
    return out


def _artifacts(tmp_path, records, summary=None):
    (tmp_path / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(summary or {"time_to_first_token": {"avg": 1}}))
    return tmp_path


def test_aiperf_records_count_the_profiling_phase_only(tmp_path):
    records = [
        _record("warmup", 0.0, 10.0, ttft=5000.0, itl=90.0),  # a slow warm-up: not counted anywhere
        _record("profiling", 10.0, 11.0, ttft=400.0, itl=25.0),
        _record("profiling", 11.0, 12.0, ttft=420.0, itl=27.0),
        _record("profiling", 12.0, 12.5, ttft=0.0, itl=0.0, error={"code": 500}),
        _record("profiling", 12.5, 14.0, ttft=410.0, itl=26.0),
    ]
    found = peer_agreement.read_aiperf(_artifacts(tmp_path, records))
    assert found["requests"] == 3 and found["errors"] == 1
    assert found["ttft_ms"] == [400.0, 420.0, 410.0]
    assert found["tpot_ms"] == [25.0, 27.0, 26.0]
    # 3 x 16 tokens over 10.0 s (first send) to 14.0 s (last end), as quantkit counts a step
    assert found["output_tokens_per_s"] == pytest.approx(48 / 4.0)
    assert found["summary"]["time_to_first_token"] == {"avg": 1}


def test_aiperf_without_an_answer_is_one_line(tmp_path):
    records = [_record("profiling", 0.0, 1.0, 0.0, 0.0, error={"code": 503})]
    with pytest.raises(SystemExit, match="no request"):
        peer_agreement.read_aiperf(_artifacts(tmp_path, records))


def _tool(ttft, tpot, tps):
    return {"ttft_ms": ttft, "tpot_ms": tpot, "output_tokens_per_s": tps}


def test_compare_says_within_only_inside_ten_percent():
    ours = _tool([400.0 + i for i in range(100)], [25.0 + i / 100 for i in range(100)], 19.5)
    peer = _tool([420.0 + i for i in range(100)], [30.0 + i / 100 for i in range(100)], 19.0)
    rows = {r["metric"]: r for r in peer_agreement.compare(2, ours, peer)}
    assert set(rows) == {
        "TTFT P50 ms",
        "TTFT P99 ms",
        "TPOT vs ITL P50 ms",
        "TPOT vs ITL P99 ms",
        "output tokens/s",
    }
    ttft = rows["TTFT P50 ms"]
    assert ttft["within"] and ttft["difference"] == pytest.approx((449.5 - 469.5) / 469.5)
    low, high = ttft["peer_minus_ours_ci95_ms"]
    assert low <= 20.0 <= high  # the peer's shift, inside its interval
    assert not rows["TPOT vs ITL P50 ms"]["within"]  # 25.5 vs 30.5: 16% apart
    assert rows["output tokens/s"]["within"] and rows["output tokens/s"]["peer_minus_ours_ci95_ms"] is None


def test_tabulate_reports_each_clients_share_and_the_verdict():
    same = _tool([400.0] * 50 + [410.0] * 50, [25.0] * 100, 19.0)
    tool = {**same, "requests": 100, "errors": 0, "client_cpu_share": 0.01, "server_cpu_share": 0.99}
    raw = {"levels": {"1": {"quantkit": {**tool, "others_cpu_share": 0.0}, "aiperf": {**tool, "others_cpu_share": 0}}}}

    class Args:
        server_cpus, client_cpus, requests, prompt_len, gen_len = "0", "1", 100, 128, 16

    out = peer_agreement.tabulate(raw, Args)
    assert out["all_within"] and out["levels"] == [1]
    assert {r["tool"] for r in out["tables"]["clients"]["rows"]} == {"quantkit", "aiperf"}
    assert all(r["verdict"] == "yes" for r in out["tables"]["agreement"]["rows"])


def _log(ms):
    return "".join(
        f"slot print_timing: id  0 | task {i} | prompt eval time =  {v:8.2f} ms /   129 tokens\n"
        f"slot print_timing: id  0 | task {i} |        eval time =  {v / 2:8.2f} ms /    15 tokens\n"
        for i, v in enumerate(ms)
    )


def test_the_servers_prompt_times_split_by_run_after_each_warm_up():
    ran = [{}, {}]
    peer_agreement.server_timings(ran, _log([900.0, 400.0, 410.0, 800.0, 420.0, 430.0]), requests=2)
    assert ran[0]["server_prefill_ms"] == [400.0, 410.0] and ran[1]["server_prefill_ms"] == [420.0, 430.0]
    assert ran[1]["server_decode_ms"] == pytest.approx([210.0 / 15, 215.0 / 15])


def test_a_log_that_does_not_count_up_gives_no_run_the_servers_figures():
    ran = [{}, {}]
    peer_agreement.server_timings(ran, _log([900.0, 400.0, 410.0, 800.0, 420.0]), requests=2)
    assert ran == [{}, {}]


def test_aiperf_is_given_a_rate_so_its_scheduler_sleeps(tmp_path):
    """AIPerf 0.13 with only --concurrency spins a core while every slot is busy (its timing loop
    retries without sleeping): the command caps concurrency and gives a constant 1000/s rate."""
    from types import SimpleNamespace

    args = SimpleNamespace(aiperf="aiperf", requests=100, gen_len=16, tokenizer="tok")
    cmd = peer_agreement.aiperf_command("http://h", 4, args, tmp_path / "p.jsonl", tmp_path / "o")
    pairs = dict(zip(cmd, cmd[1:]))
    assert pairs["--concurrency"] == "4" and pairs["--request-rate"] == "1000"
    assert pairs["--arrival-pattern"] == "constant" and pairs["--request-count"] == "100"


AIPERF = Path.home() / ".cache" / "qk-peers" / "aiperf" / "bin" / "aiperf"


@pytest.mark.skipif(not AIPERF.is_file(), reason="AIPerf is not installed (python3 -m venv ~/.cache/qk-peers/aiperf)")
def test_the_installed_aiperf_takes_every_option_the_command_gives(tmp_path):
    import re
    import subprocess
    from types import SimpleNamespace

    done = subprocess.run([str(AIPERF), "profile", "--help"], capture_output=True, text=True, timeout=300)
    flags = set(re.findall(r"--[a-z0-9][a-z0-9-]*", done.stdout))
    args = SimpleNamespace(aiperf=str(AIPERF), requests=1, gen_len=1, tokenizer="t")
    given = {w for w in peer_agreement.aiperf_command("http://h", 1, args, tmp_path, tmp_path) if w.startswith("--")}
    assert given <= flags, sorted(given - flags)
