"""`quantkit run` at KV depths (pipeline/depths.py): each variant's TPOT at each depth beside the
baseline's, the measured ratio next to the roofline's (bytes per step), and the long-context table;
a variant's llama.cpp cache types reach llama.cpp's bench and eval; the settings no run can keep
(a quantized V cache with flash attention off, a depth past the context) are refused before any work."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from installed import needs_llama_cpp

from quantkit.core.eval_results import Interval95, KLSummary, PositionBucket
from quantkit.pipeline.depths import ContextRow, DepthRow, context_rows, context_table, depth_rows, depth_table
from quantkit.pipeline.variant_record import VariantRecord


def _row(name, engine, depth, tpot, mb, kv_cache="f16", flash_attn=True):
    return SimpleNamespace(
        name=name,
        engine=engine,
        depth=depth,
        tpot_ms=tpot,
        bytes_per_token=mb * 1e6,
        kv_bytes_per_token=23040.0 if kv_cache in ("f16", "bfloat16") else 12240.0,
        kv_cache=kv_cache,
        flash_attn=flash_attn,
    )


def test_each_depth_row_is_set_beside_the_baseline_at_the_same_depth():
    rows = [
        _row("fp16", "llamacpp", 0, 20.0, 270.0),
        _row("fp16", "llamacpp", 8128, 40.0, 460.0),
        _row("int4-kv8", "llamacpp", 0, 8.0, 120.0, "q8_0"),
        _row("int4-kv8", "llamacpp", 8128, 16.0, 220.0, "q8_0"),
        _row("int4-kv8", "compiled", 8128, 30.0, 300.0, "bfloat16", None),  # no baseline row on this engine
        SimpleNamespace(name="fp16", engine="llamacpp", depth=None, tpot_ms=19.0),  # a row without a depth
    ]
    got = {(d.name, d.engine, d.depth): d for d in depth_rows(rows, "fp16")}
    assert len(got) == 5
    deep = got[("int4-kv8", "llamacpp", 8128)]
    assert deep.reference == "fp16" and deep.tpot_ratio == pytest.approx(0.4)
    assert deep.predicted_ratio == pytest.approx(220 / 460) and deep.kv_cache == "q8_0"
    assert (
        got[("int4-kv8", "compiled", 8128)].reference is None and got[("int4-kv8", "compiled", 8128)].tpot_ratio is None
    )
    assert DepthRow.from_json(deep.to_json()) == deep
    table = depth_table(list(got.values()))
    assert "| int4-kv8 | llamacpp, flash attention on | 8,128 | q8_0 | 220.0 | 16.00 | 0.400 | 0.478 |" in table


def _bucket(lo, hi, kl):
    return PositionBucket(
        lo, hi, 100, 20.0, 18.0, 11.1, KLSummary(kl, kl, kl, kl), 0.8, Interval95((9.0, 13.0), (kl, kl))
    )


def _eval(engine, buckets):
    text = SimpleNamespace(positions=tuple(buckets), label="factbook", kl_kind="exact")
    return SimpleNamespace(engine=engine, texts=(text,))


def test_the_long_context_row_pairs_each_engine_with_the_eval_that_runs_it_so():
    rec = VariantRecord(
        "int4-kv8",
        eval=_eval("transformers", [_bucket(0, 512, 0.1), _bucket(512, 4096, 0.2), _bucket(4096, 8192, 0.3)]),
        evals={
            "llamacpp": _eval("llamacpp", [_bucket(0, 512, 0.11), _bucket(512, 4096, 0.21), _bucket(4096, 8192, 0.31)])
        },
    )
    bench = [_row("int4-kv8", "llamacpp", d, 8.0 + d / 1000, 120.0, "q8_0") for d in (0, 4096, 8128)]
    bench += [_row("int4-kv8", "compiled", d, 20.0, 300.0, "bfloat16", None) for d in (0, 4096)]
    got = {c.engine: c for c in context_rows(rec, bench, 4.5, 8192)}
    llama, torch_engine = got["llamacpp"], got["compiled"]
    assert (llama.eval_engine, llama.bucket.lo, llama.bucket.kld.mean) == ("llamacpp", 4096, 0.31)
    assert (torch_engine.eval_engine, torch_engine.bucket.kld.mean) == ("transformers", 0.3)
    assert llama.kv_cache_mb == pytest.approx(12240 * 8192 / 1e6) and [d.depth for d in llama.decode] == [0, 4096, 8128]
    assert ContextRow.from_json(llama.to_json()) == llama
    table = context_table(list(got.values()))
    assert "KV MB at 8,192" in table and "TPOT ms at 8,128" in table and "at positions 4096–8192" in table
    assert "| int4-kv8 | compiled | 4.50 | bfloat16 | 23,040 | 188.7 | 20.00 | 20.00 | — |" in table


def _suite(tmp_path: Path, text: Path, flash_attn: str = "on", depths: str = "0, 40") -> Path:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "description: depths\nvariants:\n  - name: int4-kv8\n    steps:\n"
        "      - quantize: {method: gptq, bits: 4, group_size: 32, kv_cache: {fp8: tensor, llamacpp: q8_0}}\n"
        f"eval:\n  engines: [transformers, llamacpp]\n  texts: [file:{text}]\n  seq_len: 64\n  max_tokens: 128\n"
        "  position_buckets: [16, 32]\n"
        f"bench:\n  engines: [eager, llamacpp]\n  depths: [{depths}]\n  flash_attn: {flash_attn}\n  prompt_len: 12\n"
        "  gen_len: 4\n  repeats: 1\n  min_seconds: 0\n  warmups: 0\n"
    )
    return suite


SETS = ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64"]


@needs_llama_cpp
def test_a_run_at_depths_reports_both_tables_with_the_variants_cache(cli, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "run"
    code, _, err, rep = cli(
        "run",
        str(_suite(tmp_path, tiny_text)),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        *SETS,
        "--json",
    )
    assert code == 0, err
    assert rep["schema_version"] == 5 and not rep["failed"]
    depths = {(d["name"], d["engine"], d["depth"]): d for d in rep["depths"]}
    assert set(depths) == {(n, e, d) for n in ("baseline", "int4-kv8") for e in ("eager", "llamacpp") for d in (0, 40)}
    deep = depths[("int4-kv8", "llamacpp", 40)]
    assert (
        deep["kv_cache"] == "q8_0"
        and deep["reference"] == "baseline"
        and depths[("baseline", "llamacpp", 40)]["kv_cache"] == "f16"
    )
    assert deep["predicted_ratio"] == pytest.approx(
        deep["bytes_per_token"] / depths[("baseline", "llamacpp", 40)]["bytes_per_token"]
    )
    ctx = {(c["name"], c["engine"]): c for c in rep["long_context"]}
    assert ctx[("int4-kv8", "llamacpp")]["kv_cache"] == "q8_0" and ctx[("int4-kv8", "eager")]["kv_cache"] == "bfloat16"
    assert (
        ctx[("int4-kv8", "llamacpp")]["eval_engine"] == "llamacpp"
        and ctx[("int4-kv8", "llamacpp")]["bucket"]["lo"] == 32
    )
    assert ctx[("int4-kv8", "eager")]["eval_engine"] == "transformers" and ctx[("int4-kv8", "eager")]["context"] == 1024
    scorer = rep["variants"]["int4-kv8"]["evals"]["llamacpp"]["scorer"]
    assert scorer["kv_cache_type"] == "q8_0" and scorer["flash_attn"] is True
    assert rep["variants"]["int4-kv8"]["eval"]["scorer"]["kv_cache_type"] == "fp8_e4m3 K/V, per-tensor scales"
    md = (out / "report.md").read_text()
    assert "**Long context**" in md and "**TPOT at depth against the baseline**" in md and "KV depths 0,40" in md


@pytest.mark.parametrize(
    "flash_attn, depths, needle",
    [
        ("off", "0, 40", "variant int4-kv8: kv_cache.llamacpp q8_0 with bench.flash_attn: a q8_0 V cache runs"),
        ("on", "0, 1021", "bench.depths 1021 + bench.gen_len 4 = 1025 is longer than the model's context of 1024"),
    ],
)
def test_a_run_no_engine_can_keep_is_refused_before_any_work(
    cli, tiny_llama, tiny_text, tmp_path, flash_attn, depths, needle
):
    out = tmp_path / "run"
    code, _, err, _ = cli(
        "run",
        str(_suite(tmp_path, tiny_text, flash_attn, depths)),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        *SETS,
    )
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
