"""The engine interface: the registry, the shared harness driving any engine, decode attention at
the KV heads' width. The vLLM engine's tests are in test_engines_vllm.py."""

import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from quantkit.bench import harness
from quantkit.bench.engines import ENGINES, engine_class
from quantkit.bench.engines.engine import Engine, EngineSettings
from quantkit.core.precision import Precision
from quantkit.errors import QuantkitError


class CountingEngine(Engine):
    """An engine that records what the harness asks of it (no model)."""

    name, compiles = "counting", False

    def __init__(self):
        self.calls = []

    def prepare(self, ids):
        return list(ids)

    def reset(self, capacity):
        self.calls.append(("reset", capacity))

    def prefill(self, prompt):
        self.calls.append(("prefill", len(prompt)))
        return prompt[-1] + 1

    def decode(self, token, pos):
        self.calls.append(("decode", pos))
        return token + 1


def test_registry_is_explicit_and_lazy():
    assert {"eager", "compiled", "vllm", "llamacpp"} <= set(ENGINES)
    assert all(e.module.startswith("quantkit.bench.engines.") for e in ENGINES.values())
    assert engine_class("eager").name == "eager" and engine_class("compiled").compiles
    with pytest.raises(QuantkitError, match=f"unknown engine 'llama'; valid: {', '.join(ENGINES)}$"):
        engine_class("llama")


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_engine_carries_its_capabilities(name):
    cls = engine_class(name)
    assert cls.name == name and issubclass(cls, Engine)
    for attr in (
        "compiles",
        "full_logprobs",
        "takes_gguf",
        "tensor_parallel",
        "sizes_own_memory",
        "flash_attn_lever",
        "anchored",
    ):
        assert isinstance(getattr(cls, attr), bool), attr
    assert cls.min_depth >= 0 and (cls.min_depth == 0 or cls.min_depth_reason)
    assert cls.depth_advice(False) and cls.depth_advice(True)
    assert cls.devices and set(cls.devices) <= {"cpu", "cuda"}
    assert cls.default_threads() is None or cls.default_threads() >= 1


@pytest.mark.parametrize("name", list(ENGINES))
def test_settings_refuse_by_capability(name, monkeypatch):
    """--tensor-parallel above 1 and a device outside the engine's list are refused in one line that
    names the engines able to; the engine's own availability check runs before anything loads."""
    from quantkit.bench.bench_settings import BenchSettings, check_settings

    cls = engine_class(name)
    monkeypatch.setattr(cls, "check", classmethod(lambda c, device: None))  # as if its library were installed
    able = [n for n in ENGINES if engine_class(n).tensor_parallel]
    if not cls.tensor_parallel:
        with pytest.raises(QuantkitError, match=f"above 1 only with --engine {' [|] '.join(able)}$"):
            check_settings(BenchSettings(device="cpu", engine=name, tensor_parallel=2))
    if "cpu" not in cls.devices:
        with pytest.raises(QuantkitError, match=f"--engine {name} needs a CUDA GPU .--device cuda., not --device cpu"):
            check_settings(BenchSettings(device="cpu", engine=name))
        return
    check_settings(BenchSettings(device="cpu", engine=name))
    monkeypatch.setattr(
        cls, "check", classmethod(lambda c, device: (_ for _ in ()).throw(QuantkitError(f"{c.name}: missing")))
    )
    with pytest.raises(QuantkitError, match=f"{name}: missing"):
        check_settings(BenchSettings(device="cpu", engine=name))


def test_a_gguf_file_is_refused_by_engines_that_do_not_read_one(cli, tmp_path, monkeypatch):
    import vllm_fake

    vllm_fake.use(monkeypatch, tmp_path / "vllm")  # vLLM there, so what is refused is the file
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    readers = [n for n in ENGINES if engine_class(n).takes_gguf]
    for name in ENGINES:
        if name in readers or "cpu" not in engine_class(name).devices:
            continue
        code, _, err, _ = cli("bench", str(f), "--engine", name, "--device", "cpu")
        assert code == 2 and "a file; the" in err and f"GGUF files: --engine {' | '.join(readers)}" in err, err


def test_harness_drives_any_engine():
    e = CountingEngine()
    t = harness.measure(e, [1, 2, 3], 4, repeats=2, min_seconds=0, warmups=1)
    assert t.warmups == 1 and len(t.ttft_s) == 2 and all(len(s) == 3 for s in t.step_s)
    # each repeat: a cache for prompt + generated tokens, prefill, decode at positions 3, 4, 5
    assert e.calls[:5] == [("reset", 7), ("prefill", 3), ("decode", 3), ("decode", 4), ("decode", 5)]
    assert t.summary().per_step.to_json() == {"measured": True}


def test_compiling_engine_gets_a_warmup():
    e = CountingEngine()
    e.compiles = True
    t = harness.measure(e, [1, 2], 3, repeats=1, min_seconds=0, warmups=0)
    assert t.warmups == 1 and sum(c[0] == "prefill" for c in e.calls) == 2


def test_sweep_warms_each_length_then_samples():
    e = CountingEngine()
    times = harness.time_prefill(e, [5] * 8, 12, samples=5)
    assert len(times) == 5 and sum(c == ("prefill", 8) for c in e.calls) == 6  # one untimed first
    assert all(c == ("reset", 12) for c in e.calls if c[0] == "reset")


def test_summary_without_per_step_times_says_why():
    t = harness.Timings(ttft_s=[0.1, 0.2], step_s=[[0.01, 0.03], [0.02, 0.02]], warmups=1)
    s = t.summary("vLLM delivered 2 tokens from one engine step")
    assert s.step_ms is None and s.step_times_ms is None
    assert s.to_json()["per_step"] == {"measured": False, "reason": "vLLM delivered 2 tokens from one engine step"}
    assert s.tpot_ms.median == pytest.approx(20.0)  # decode time / tokens, measured either way


@pytest.mark.parametrize("filled", [7, 12])
def test_gqa_decode_attention_equals_repeat_kv_without_copying(monkeypatch, filled):
    """One query token against a masked static cache: the same values as transformers' sdpa with
    repeat_kv, without calling repeat_kv (no copy of K/V at the query heads' width)."""
    from transformers.integrations import sdpa_attention as sa

    from quantkit.bench.engines._torch import gqa_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((1, 8, 1, 16), (1, 2, 12, 16), (1, 2, 12, 16)))
    mask = (torch.arange(12) < filled).view(1, 1, 1, 12) if filled < 12 else None
    module = SimpleNamespace(num_key_value_groups=4, is_causal=True, training=False)
    ref, _ = sa.sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    monkeypatch.setattr(sa, "repeat_kv", lambda *a: pytest.fail("K/V copied to the query heads"))
    out, _ = gqa_attention(module, q, k, v, mask, scaling=0.25)
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-5)


def test_torch_engines_use_the_gqa_attention(tiny_llama):
    from quantkit.bench.engines._torch import ATTENTION

    bf16 = Precision("bfloat16", "asked for", asked=True)
    e = engine_class("eager").load(tiny_llama, EngineSettings(torch.device("cpu", 0), max_tokens=32, precision=bf16))
    try:
        assert e.model.config._attn_implementation == ATTENTION
        e.reset(20)
        tok = e.prefill(e.prepare(list(range(10))))
        assert e.decode(tok, 10).shape == (1, 1)
        assert e.describe()["dtype"] == "bfloat16" and e.describe()["device"] == "cpu:0"
    finally:
        e.close()


def test_interface_doc_names_every_method():
    """The llama.cpp engine will be written against engine.py: its doc lists what the harness calls."""
    doc = textwrap.dedent(sys.modules["quantkit.bench.engines.engine"].__doc__)
    for method in (
        "load",
        "logprobs",
        "prepare",
        "reset",
        "prefill",
        "decode",
        "sync",
        "as_token",
        "rewind",
        "cache_depth",
        "weight_bytes",
        "step_bytes",
        "describe",
        "close",
    ):
        assert f"{method}(" in doc and callable(getattr(Engine, method))


TOY_ENGINE = '''
"""A bench engine written in a test only: the eager engine under another name."""

from quantkit.bench.engines.eager_engine import Engine as Eager


class Engine(Eager):
    name = "toy"
'''


def test_a_new_engine_is_one_module_and_one_entry(cli, tiny_llama, tmp_path, monkeypatch):
    """An engine is its module and one registry entry: `quantkit bench --engine` runs it and a recipe
    takes its name, with nothing else told of it."""
    import quantkit.bench.probe as probing
    from quantkit.core.engine_registry import EngineEntry
    from quantkit.recipe.files import recipe_from_dict

    (tmp_path / "toy_bench_engine.py").write_text(TOY_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ENGINES, "toy", EngineEntry("toy_bench_engine"))  # its registry line
    monkeypatch.setattr(probing, "run_probe", _probe)
    fast = ["--prompt-len", "8", "--gen-len", "3", "--repeats", "1", "--min-seconds", "0", "--warmups", "0"]
    code, _, err, data = cli("bench", str(tiny_llama), "--engine", "toy", "--device", "cpu", *fast, "--json")
    assert code == 0, err
    (row,) = data["rows"]
    assert row["engine"] == "toy" and row["tpot_ms"] > 0 and data["settings"]["engine"] == "toy"
    assert row["self_check"]["status"] == "passed"
    bench = recipe_from_dict({"steps": [{"quantize": {"method": "rtn"}}], "bench": {"engines": ["toy", "eager"]}})
    assert bench.bench.engines == ("toy", "eager")


def _probe(device, threads=None) -> dict:
    """The device probe's figures, fixed (a test times nothing it asserts)."""
    return {
        "device": str(device),
        "name": "fake cpu",
        "threads": 2,
        "read_gbps": 20.0,
        "copy_gbps": 10.0,
        "bf16_matmul_tflops": 1.0,
        "matmul_tflops": {"bfloat16": 1.0, "float16": 0.15, "float32": 0.15},
        "llc_bytes": None,
        "measured_at": "now",
        "method": "injected",
        "spread": {"read_gbps": {"best": 20.0, "median": 20.0, "worst": 20.0, "spread_pct": 0.0}},
    }
