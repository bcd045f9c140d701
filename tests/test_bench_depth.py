"""Decode at depth (`quantkit bench --depth`): the depths checked before anything loads, one prefill
per depth with every repeat decoding from that cache (each engine rewinds it, and really holds the
depth before a run), each engine's rows, the rule check across models and depths, what a row far
above its bytes' time is told, flash attention as llama.cpp's lever, --plan's prediction, the plot."""

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from installed import needs_llama_cpp

from quantkit.bench import harness
from quantkit.bench.accounting import kv_concat, kv_llamacpp, kv_static, mean_step_bytes
from quantkit.bench.bench_records import BenchResult
from quantkit.bench.engines import engine_class
from quantkit.bench.engines.engine import Engine, EngineSettings
from quantkit.bench.rows import DEPTH_EXCESS, depth_notes

FAST = ["--gen-len", "4", "--repeats", "2", "--min-seconds", "0", "--warmups", "1", "--no-self-check"]
V2 = Path(__file__).with_name("bench_v2.json")


class DepthEngine(Engine):
    """An engine that keeps a count of cached tokens and records what the harness asks of it."""

    name, compiles = "depth", False

    def __init__(self, prefill_s: float = 0.0, rewinds: bool = True):
        self.calls, self.cached, self.prefill_s, self.rewinds = [], 0, prefill_s, rewinds

    def prepare(self, ids):
        return list(ids)

    def as_token(self, token_id):
        return token_id

    def reset(self, capacity):
        self.calls.append(("reset", capacity))
        self.cached = 0

    def prefill(self, prompt):
        time.sleep(self.prefill_s)
        self.calls.append(("prefill", len(prompt)))
        self.cached = len(prompt)
        return prompt[-1] + 1

    def decode(self, token, pos):
        assert pos == self.cached, (pos, self.cached)
        self.calls.append(("decode", pos, self.cached))
        self.cached += 1
        return token + 1

    def rewind(self, depth):
        self.calls.append(("rewind", depth))
        if self.rewinds:
            self.cached = depth

    def cache_depth(self):
        return self.cached


# ---------------------------------------------------------------- the harness


def test_a_depth_is_prefilled_once_and_every_run_decodes_from_it():
    e = DepthEngine()
    t = harness.measure_depth(e, list(range(64)), 40, 5, repeats=3, min_seconds=0, warmups=1)
    assert [c for c in e.calls if c[0] == "prefill"] == [("prefill", 40)]
    assert [c for c in e.calls if c[0] == "reset"] == [("reset", 45)]  # the cache sized to the depth + gen_len
    decodes = [c for c in e.calls if c[0] == "decode"]
    assert len(decodes) == (1 + 3) * 4 and all(c[1] == c[2] for c in decodes)
    # each run: 4 steps at positions 40..43, from a cache holding exactly the depth, then rewound to it
    assert [c[1] for c in decodes[:4]] == [40, 41, 42, 43] and decodes[4][1] == 40
    assert sum(c == ("rewind", 40) for c in e.calls) == 4
    assert len(t.ttft_s) == 1 and len(t.step_s) == 3 and all(len(s) == 4 for s in t.step_s)


def test_depth_zero_prefills_nothing_and_feeds_a_first_token():
    e = DepthEngine()
    t = harness.measure_depth(e, [7, 8], 0, 3, repeats=2, min_seconds=0, warmups=0)
    assert not [c for c in e.calls if c[0] == "prefill"] and t.ttft_s == []
    assert t.summary().ttft_ms is None and t.summary().repeats == 2
    assert [c[1] for c in e.calls if c[0] == "decode"][:2] == [0, 1]


def test_a_shallow_depth_is_prefilled_again_for_its_ttft_a_deep_one_once():
    fast = DepthEngine(prefill_s=0.001)
    t = harness.measure_depth(fast, list(range(16)), 8, 3, repeats=1, min_seconds=10, warmups=0)
    assert len(t.ttft_s) == harness.SWEEP_SAMPLES  # at most that many while they sum to under --min-seconds
    assert fast.calls[-1][0] == "rewind" and fast.cached == 8
    slow = DepthEngine(prefill_s=0.05)
    t = harness.measure_depth(slow, list(range(16)), 8, 3, repeats=1, min_seconds=0.02, warmups=0)
    assert len(t.ttft_s) == 1 and sum(c[0] == "prefill" for c in slow.calls) == 1
    assert harness.prefill_samples(0.05, 0.02, 5) == 1 and harness.prefill_samples(0.001, 10, 5) == 5
    assert harness.prefill_samples(0.3, 1.0, 5) == 4 and harness.prefill_samples(9.0, 0, 5) == 1


def test_a_cache_not_at_the_depth_before_a_run_is_an_error():
    with pytest.raises(RuntimeError, match="holds 44 tokens before a run at depth 40"):
        harness.measure_depth(DepthEngine(rewinds=False), list(range(64)), 40, 5, repeats=2, min_seconds=0, warmups=1)


# ---------------------------------------------------------------- the engines' rewind


@pytest.mark.parametrize("name", ["eager", "compiled"])
def test_a_torch_engine_rewinds_its_cache_to_the_depth(tiny_llama, name):
    """After a run's steps and a rewind the cache holds the depth again, and the same steps give the
    same logits: the repeats really decode from the prefilled cache."""
    e = engine_class(name).load(tiny_llama, EngineSettings(device=torch.device("cpu"), max_tokens=40))
    try:
        e.reset(24)
        first = e.prefill(e.prepare(list(range(3, 23))))
        assert e.cache_depth() == 20

        def run():
            tok, out = first, []
            for i in range(3):
                out.append(e.decode_logits(tok, 20 + i).float())
                tok = out[-1].argmax(-1, keepdim=True)
            return out

        once = run()
        assert e.cache_depth() == 23
        e.rewind(20)
        assert e.cache_depth() == 20
        again = run()
        assert all(torch.allclose(a, b, atol=1e-3) for a, b in zip(once, again))
    finally:
        e.close()


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama, tmp_path_factory):
    """The tiny Llama's exact F16 GGUF, with the export record the self-check reads."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    out = tmp_path_factory.mktemp("depth-gguf") / "llama-gqa-f16.gguf"
    env = {"QUANTKIT_HOME": str(out.parent / "home"), "HF_HUB_OFFLINE": "1"}
    res = CliRunner().invoke(group, ["export", str(tiny_llama), "--format", "gguf", "--out", str(out)], env=env)
    assert res.exit_code == 0, res.stderr
    return out


@needs_llama_cpp
def test_llama_cpp_rewinds_its_cache_to_the_depth(tiny_gguf):
    e = engine_class("llamacpp").load(tiny_gguf, EngineSettings(device=torch.device("cpu"), max_tokens=64, threads=1))
    try:
        e.reset(40)
        first = e.prefill(list(range(3, 33)))
        assert e.cache_depth() == e.llm.n_tokens == 30

        def run():
            tok, out = first, []
            for i in range(4):
                tok = e.decode(tok, 30 + i)
                out.append(tok)
            return out

        once = run()
        assert e.cache_depth() == e.llm.n_tokens == 34
        e.rewind(30)
        assert e.cache_depth() == e.llm.n_tokens == 30  # llama.cpp's own cells and llama-cpp-python's n_past
        assert run() == once
    finally:
        e.close()


@needs_llama_cpp
def test_flash_attention_reaches_llama_cpp(tiny_gguf):
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    lc = import_llama_cpp()
    for fa, want in ((True, lc.LLAMA_FLASH_ATTN_TYPE_ENABLED), (None, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)):
        e = engine_class("llamacpp").load(
            tiny_gguf, EngineSettings(device=torch.device("cpu"), max_tokens=64, threads=1, flash_attn=fa)
        )
        try:
            assert e.llm.context_params.flash_attn_type == want and e.describe()["flash_attn"] is bool(fa)
        finally:
            e.close()


# ---------------------------------------------------------------- the command


def _no_load(monkeypatch):
    import quantkit.bench.probe as probing

    monkeypatch.setattr(probing, "run_probe", lambda *a, **k: pytest.fail("probed the device"))
    for name in ("eager", "llamacpp"):
        monkeypatch.setattr(engine_class(name), "load", classmethod(lambda *a: pytest.fail("loaded a model")))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--depth", "0,1021"], "--depth 1021 + 4 generated tokens (1025) exceed the model's context (1024)"),
        (["--depth", "-1"], "--depth -1: each must be at least 0"),
        (["--depth", "8,8"], "--depth: each depth at most once"),
        (["--depth", "8", "--sweep", "16"], "--sweep and --depth"),
        (["--depth", "x"], "--depth 'x': expected comma-separated integers"),
        (["--depth", "8", "--update-card"], "--update-card writes one row per model into its card"),
        (["--flash-attn", "on"], "--flash-attn on: the eager engine has no flash-attention setting (--engine llamacpp"),
    ],
)
def test_depths_are_checked_before_anything_loads(cli, tiny_llama, monkeypatch, args, needle):
    _no_load(monkeypatch)
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "eager", *FAST, *args)
    assert code == 2 and needle in err and "Traceback" not in err, err


@needs_llama_cpp
def test_a_gguf_deeper_than_its_context_is_refused_before_it_loads(cli, tiny_gguf, monkeypatch):
    _no_load(monkeypatch)
    code, _, err, _ = cli("bench", str(tiny_gguf), "--engine", "llamacpp", *FAST, "--depth", "2000")
    assert code == 2 and "--depth 2000 + 4 generated tokens (2004) exceed the model's context (1024)" in err


@pytest.mark.parametrize("name", ["eager", "compiled"])
def test_torch_engines_give_a_row_per_depth(cli, tiny_llama, tmp_path, name):
    plot = tmp_path / "rule.png"
    code, _, err, data = cli(
        "bench", str(tiny_llama), "--engine", name, *FAST, "--depth", "0,8,40", "--plot", str(plot), "--json"
    )
    assert code == 0, err
    res = BenchResult.from_json(data)  # the JSON reads back as the record it was written from
    assert [r.depth for r in res.rows] == [0, 8, 40] and res.settings.depths == (0, 8, 40)
    for r in res.rows:
        assert r.prompt_len == r.depth and r.kv_cache_tokens == r.depth + 4 and r.stats.repeats >= 2
        assert r.tpot_ms > 0 and len(r.stats.step_times_ms[0]) == 3
        kv, w = r.kv_bytes_per_token, r.weight_bytes_per_token
        if name == "compiled":  # the static cache is sized per depth and read whole by every step
            assert r.bytes_per_token == w + kv_static(kv, r.depth + 4)
        else:  # the dynamic cache concatenates the context it holds
            assert r.bytes_per_token == pytest.approx(mean_step_bytes(lambda c: w + kv_concat(kv, c), r.depth, 4))
    zero, eight, forty = res.rows
    assert zero.ttft_ms is None and zero.predicted_ttft_ms is None and zero.ttft_efficiency is None
    assert eight.ttft_ms > 0 and forty.predicted_ttft_ms > eight.predicted_ttft_ms
    assert forty.bytes_per_token > eight.bytes_per_token > zero.bytes_per_token
    kept = sum(not r.disturbed for r in res.rows)  # a disturbed row is kept out of the fit
    assert res.fit.points == kept and len(res.fit.measured_over_model) == (kept if kept > 1 else 0)
    assert all(r.attribution is not None for r in res.rows)
    assert plot.is_file() and Path(res.depth_plot) == plot.with_name("rule-depth.png")
    assert Path(res.depth_plot).stat().st_size > 1000


def test_the_rule_check_fits_across_models_and_depths(cli, tiny_dir):
    code, out, err, data = cli(
        "bench",
        str(tiny_dir / "llama-mha"),
        str(tiny_dir / "llama-gqa"),
        "--engine",
        "eager",
        *FAST,
        "--depth",
        "0,16,48",
        "--json",
    )
    assert code == 0, err
    rows = data["rows"]
    assert [(r["name"], r["depth"]) for r in rows] == [(n, d) for n in ("llama-mha", "llama-gqa") for d in (0, 16, 48)]
    fit = data["fit"]
    kept = sum(not r["disturbed"] for r in rows)  # a disturbed row is kept out of the fit
    assert fit["points"] == kept and len(fit["measured_over_model"]) == (kept if kept > 1 else 0)
    code, out, err, _ = cli("bench", str(tiny_dir / "llama-gqa"), "--engine", "eager", *FAST, "--depth", "0,16")
    assert code == 0 and "| variant | depth | kernel |" in out and "| llama-gqa | 16 | dense |" in out


def _rows(engine: str, flash_attn, effs: dict[int, float]):
    """Rows of one model at the given depths, each with the TPOT that gives it that efficiency."""
    base = BenchResult.from_json(json.loads(V2.read_text())).rows[0]
    out = []
    for depth, eff in effs.items():
        pred = 1.0 + depth / 1000  # ms: the bytes grow with the depth
        out.append(
            replace(
                base,
                engine=engine,
                flash_attn=flash_attn,
                depth=depth,
                predicted_tpot_ms=pred,
                tpot_ms=pred / eff,
                tpot_efficiency=eff,
            )
        )
    return out


def test_a_depth_far_above_its_bytes_time_says_why_and_what_helps():
    ok = 0.5 * (1 - DEPTH_EXCESS) + 0.01
    rows = depth_notes(_rows("llamacpp", False, {0: 0.5, 1024: ok, 4096: 0.27}))
    assert [("attention_compute" in r.flags) for r in rows] == [False, False, True]
    note = rows[2].notes[-1]
    assert note.startswith("depth 4096: TPOT") and "at depth 0's efficiency (50%, here 27%)" in note
    assert "--flash-attn on fuses them" in note
    fa = depth_notes(_rows("llamacpp", True, {0: 0.5, 4096: 0.3}))[1].notes[-1]
    assert "flash attention is on" in fa and "--flash-attn on" not in fa
    torch_note = depth_notes(_rows("compiled", None, {0: 0.5, 4096: 0.3}))[1].notes[-1]
    assert "sdpa" in torch_note
    assert depth_notes(_rows("llamacpp", False, {0: 0.5})) == _rows("llamacpp", False, {0: 0.5})


@needs_llama_cpp
def test_llama_cpp_depth_rows_with_and_without_flash_attention(cli, tiny_gguf):
    code, out, err, data = cli(
        "bench",
        str(tiny_gguf),
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
        "--depth",
        "0,16,300",
        "--flash-attn",
        "both",
        "--json",
    )
    assert code == 0, err
    rows = data["rows"]
    assert [(r["flash_attn"], r["depth"]) for r in rows] == [(fa, d) for fa in (False, True) for d in (0, 16, 300)]
    for r in rows:
        assert r["engine_info"]["flash_attn"] is r["flash_attn"] and r["self_check"]["status"] == "passed"
        kv_size = r["engine_info"]["n_ctx"]
        assert kv_size == 512  # the deepest depth + 4 tokens, rounded up to 256
        want = mean_step_bytes(
            lambda c: r["weight_bytes_per_token"] + kv_llamacpp(r["kv_bytes_per_token"], c, kv_size), r["depth"], 4
        )
        assert r["bytes_per_token"] == pytest.approx(want)
    assert data["settings"]["flash_attn"] == "both" and data["fit"]["points"] == sum(not r["disturbed"] for r in rows)
    code, out, err, _ = cli(
        "bench", str(tiny_gguf), "--engine", "llamacpp", *FAST, "--depth", "0,16", "--flash-attn", "both"
    )
    assert code == 0 and "| variant | depth | flash attn |" in out and "| llama-gqa-f16 | 16 | on |" in out


def test_vllm_decodes_at_depth_from_its_prefix_cache(cli, tiny_llama, tmp_path, monkeypatch):
    """vLLM cannot rewind a request: at --depth it loads with prefix caching, each repeat a request
    with the depth's prompt; a request needs one prompt token, so depth 0 is refused."""
    import vllm_fake

    record = tmp_path / "record.json"
    vllm_fake.use(monkeypatch, tmp_path / "env", record=str(record))
    code, _, err, data = cli(
        "bench", str(tiny_llama), "--engine", "vllm", "--device", "cpu", *FAST, "--depth", "1,16", "--json"
    )
    assert code == 0, err
    assert json.loads(record.read_text())["args"]["enable_prefix_caching"] is True
    assert [r["depth"] for r in data["rows"]] == [1, 16] and all(r["ttft_ms"] > 0 for r in data["rows"])
    assert all(len(r["stats"]["step_times_ms"][0]) == 3 for r in data["rows"])
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "vllm", "--device", "cpu", *FAST, "--depth", "0,16")
    assert code == 2 and "--depth 0: the vllm engine decodes after at least 1 cached token(s)" in err
    code, _, err, data = cli("bench", str(tiny_llama), "--engine", "vllm", "--device", "cpu", *FAST, "--json")
    assert code == 0 and json.loads(record.read_text())["args"]["enable_prefix_caching"] is False


def test_plan_predicts_a_depth_sweep_from_the_roofline_and_the_probe(cli):
    """Each depth's time is its prefill (the roofline's TTFT at the probed rates) as often as the
    harness times it, and the runs of decode steps over the weights and the depth's K/V."""
    from quantkit.bench.harness import prefill_samples
    from quantkit.core.hardware import shape_config
    from quantkit.core.roofline import (
        Layout,
        Shape,
        kv_bytes_per_token,
        predict_ttft_s,
        prefill_flops,
        weight_bytes_per_token,
    )
    from quantkit.costs.formulas import DECODE_EFF, MATMUL_EFF

    code, _, err, plan = cli(
        "bench", "--shape", "smollm2-135m", "--engine", "eager", "--depth", "0,1024,4096", "--plan", "--json"
    )
    assert code == 0, err
    t, mc = plan["time_breakdown"], plan["machine"]
    assert t["model_0_depth_4096"] > t["model_0_depth_1024"] > t["model_0_depth_0"] > 0
    shape = Shape.from_config(shape_config("smollm2-135m"))
    w, kv = weight_bytes_per_token(shape, Layout()), kv_bytes_per_token(shape)
    prefill = predict_ttft_s(prefill_flops(shape, 4096), mc["bf16_flops"] * MATMUL_EFF, w + kv * 4096, mc["read_bps"])
    step = (w + kv * (4096 + 32)) / (mc["read_bps"] * DECODE_EFF)
    want = prefill_samples(prefill, 2.0, 5) * prefill + (2 + 5) * 63 * step
    assert t["model_0_depth_4096"] == pytest.approx(want, abs=0.06)
    assert "one prefill of the depth" in plan["notes"][-1]
    code, _, _, shallow = cli(
        "bench", "--shape", "smollm2-135m", "--engine", "eager", "--depth", "0", "--plan", "--json"
    )
    assert shallow["seconds"] < plan["seconds"]
