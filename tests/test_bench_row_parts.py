"""The typed parts of a bench row (bench/row_parts.py): each reads back what it wrote, writes only the
fields that apply, and refuses an unknown, missing or ill-typed key in one line."""

import json
import math

import pytest

from quantkit.bench.bench_records import ADDED_OPTIONS, options_from_json, options_json, ran_options
from quantkit.bench.harness import Timings, summarize_ms
from quantkit.bench.llama_bench import anchor_lines, compare
from quantkit.bench.row_parts import (
    Anchor,
    Distribution,
    EngineInfo,
    NoAnchor,
    SelfCheck,
    TimingStats,
    anchor_from_json,
)
from quantkit.core.record_checks import RecordError
from quantkit.recipe.bench_options import BenchOptions

LLAMA_BENCH = {  # llama_bench.measure's figures for a prompt and its decode
    "tpot_ms": 10.0,
    "tg_tokens_per_s": 100.0,
    "tg_tokens": 16,
    "tg_depth": 64,
    "flash_attn": False,
    "kv_cache": "f16/f16",
    "repeats": 3,
    "build_commit": "abc123",
    "build_number": 1,
    "cpu_info": "a CPU",
    "backends": "CPU",
    "threads": 2,
    "command": "llama-bench -m x.gguf",
    "ttft_ms": 50.0,
    "pp_tokens_per_s": 1280.0,
    "pp_tokens": 64,
}


def _json(x):
    return json.loads(json.dumps(x))


def test_timing_stats_read_back_what_they_wrote_with_and_without_per_step_times():
    t = Timings(ttft_s=[0.1, 0.2], step_s=[[0.01, 0.03], [0.02, 0.02]], warmups=1)
    for note in (None, "two tokens from one engine step"):
        s = t.summary(note)
        assert TimingStats.from_json(_json(s.to_json())) == s
    assert "reason" not in t.summary().to_json()["per_step"]  # a measured row's JSON as before


def test_a_distribution_refuses_a_negative_time_and_a_missing_count():
    d = summarize_ms([0.001, 0.002]).to_json()
    with pytest.raises(RecordError, match=r"distribution.min: -1 is not at least 0"):
        Distribution.from_json({**d, "min": -1})
    with pytest.raises(RecordError, match="missing key 'n'"):
        Distribution.from_json({k: v for k, v in d.items() if k != "n"})


def test_a_skipped_self_check_writes_its_status_and_reason_only():
    s = SelfCheck.skipped("--no-self-check")
    assert s.to_json() == {"status": "skipped", "reason": "--no-self-check"}
    assert SelfCheck.from_json(s.to_json()) == s


def test_a_failed_self_check_keeps_its_infinite_kl_and_an_odd_status_is_refused():
    failed = SelfCheck("failed", reason="non-finite log-probabilities", passed=False, mean_kl=math.inf, max_kl=math.inf)
    assert SelfCheck.from_json(_json(failed.to_json())).mean_kl == math.inf
    with pytest.raises(RecordError, match="self_check.status: 'maybe'"):
        SelfCheck.from_json({"status": "maybe"})
    with pytest.raises(RecordError, match="unknown key 'mean_kll'"):
        SelfCheck.from_json({"status": "passed", "mean_kll": 0.1})
    with pytest.raises(RecordError, match="self_check.mean_kl: -0.1 is not at least 0"):
        SelfCheck.from_json({"status": "passed", "mean_kl": -0.1})


@pytest.mark.parametrize("depth", [None, 64])
def test_an_anchor_reads_back_what_it_wrote_at_a_prompt_and_at_a_depth(depth):
    figures = (
        LLAMA_BENCH if depth is None else {k: v for k, v in LLAMA_BENCH.items() if not k.startswith(("pp_", "ttft"))}
    )
    a = compare(None if depth else 60.0, 10.5, figures)
    j = _json(a.to_json())
    assert Anchor.from_json(j) == a and a.figures() == figures
    assert ("ttft_ms" in j) is (depth is None) and "ratio_ttft" in j  # a depth's JSON: no prefill, a null ratio
    assert a.disagree == (() if depth else ("ttft",))  # 60/50 is beyond 10%, 10.5/10 is not
    assert anchor_lines("m", depth, a) and anchor_lines("m", depth, NoAnchor("llama-bench is not installed")) == []


def test_a_row_anchor_is_null_an_error_or_the_figures():
    assert anchor_from_json(None) is None
    assert anchor_from_json({"error": "no llama-bench"}) == NoAnchor("no llama-bench")
    with pytest.raises(RecordError, match="anchor: missing key 'tpot_ms'"):
        anchor_from_json({k: v for k, v in compare(60.0, 10.5, LLAMA_BENCH).to_json().items() if k != "tpot_ms"})


def test_settings_read_back_and_an_older_file_gets_the_options_it_lacked_at_their_defaults():
    o = BenchOptions(device="cpu", engine="eager", prompt_sweep=(8, 16), depths=(0, 8))
    assert options_from_json(_json(options_json(o))) == o and ran_options(o) == o
    old = {k: v for k, v in options_json(o).items() if k not in ADDED_OPTIONS}
    read = options_from_json(old)
    assert read.depths == () and read.kv_caches == () and read.prompt_sweep == (8, 16)
    with pytest.raises(RecordError, match="unknown key 'repeatz'"):
        options_from_json({**options_json(o), "repeatz": 3})
    with pytest.raises(RecordError, match=r"settings.repeats must be at least 1, not 0"):
        options_from_json({**options_json(o), "repeats": 0})


def test_engine_info_keeps_the_engines_own_keys_as_it_gave_them():
    given = {
        "engine": "llamacpp",
        "device": "cpu",
        "type": "cpu",
        "name": "a CPU",
        "dtype": "Q4_0",
        "gguf_export": None,
    }
    info = EngineInfo.from_json({**given, "n_ctx": 512})
    assert info.dtype == "Q4_0" and info.own == {"gguf_export": None, "n_ctx": 512}
    assert info.to_json() == {**given, "n_ctx": 512} and EngineInfo.from_json(info.to_json()) == info
    with pytest.raises(RecordError, match="engine_info: missing key 'device'"):
        EngineInfo.from_json({"engine": "eager", "type": "cpu"})
    with pytest.raises(RecordError, match="engine_info.dtype: expected a string, not a whole number"):
        EngineInfo.from_json({**given, "dtype": 16})
