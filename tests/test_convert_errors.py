"""quantkit convert refusing bad checkpoints and bad results: one line, exit 2, nothing at --out."""

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def convert(cli, model, out, *extra):
    return cli("convert", str(REPO / "recipes" / "int4-w4a16-rtn.yaml"), "--model", str(model), "--out", str(out), *extra)


def no_load(monkeypatch):
    import quantkit.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))


def nothing_at(out: Path) -> bool:
    return not out.exists() and not list(out.parent.glob(f".{out.name}.partial-*"))


def test_shard_named_in_index_but_missing(cli, tiny_llama, tmp_path, monkeypatch):
    src = tmp_path / "sharded"
    shutil.copytree(tiny_llama, src)
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    weight_map = {n: "model.safetensors" for n in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    no_load(monkeypatch)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, src, out)
    assert code == 2 and "missing weight shard model-00002-of-00002.safetensors named in model.safetensors.index.json" in err
    assert len(err.strip().splitlines()) == 1 and nothing_at(out)


def test_bin_only_checkpoint_needs_allow_pickle(cli, tiny_llama, tmp_path, monkeypatch):
    src = tmp_path / "pickled"
    shutil.copytree(tiny_llama, src)
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    no_load(monkeypatch)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, src, out)
    assert code == 2 and "only pickle (.bin) weights" in err and "--allow-pickle" in err
    assert len(err.strip().splitlines()) == 1 and nothing_at(out)

    # with the flag the check lets it through to the load (stubbed here: the file is no real pickle)
    import quantkit.convert as qc
    from quantkit.errors import ModelError

    def reached(*a, **k):
        raise ModelError("reached load_model")

    monkeypatch.setattr(qc, "load_model", reached)
    code, _, err, _ = convert(cli, src, out, "--allow-pickle")
    assert code == 2 and "reached load_model" in err and nothing_at(out)


def test_non_finite_converted_model_refused(cli, tiny_llama, tmp_path, monkeypatch):
    import torch

    import quantkit.convert as qc

    real = qc.apply_steps

    def nan_steps(*a, **k):
        model, gqa_meta = real(*a, **k)
        with torch.no_grad():
            model.model.norm.weight[0] = float("nan")
        return model, gqa_meta

    monkeypatch.setattr(qc, "apply_steps", nan_steps)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, tiny_llama, out)
    assert code == 2 and "the converted model has non-finite values in model.norm.weight" in err
    assert "Traceback" not in err and nothing_at(out)


def test_awq_pin_memory_patch_is_a_no_op_without_an_accelerator(monkeypatch):
    """methods/patches.py: IntermediatesCache.pin_memory skips pinning without an accelerator
    (where torch would raise), calls through with one, and patching twice wraps once."""
    pytest.importorskip("llmcompressor")
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    from quantkit.methods.patches import llmcompressor_cpu_pin_memory

    calls = []

    def original(self, *args, **kwargs):
        calls.append((self, args, kwargs))
        return "pinned"

    monkeypatch.setattr(IntermediatesCache, "pin_memory", original)
    llmcompressor_cpu_pin_memory()
    patched = IntermediatesCache.pin_memory
    assert patched is not original and patched._quantkit_cpu_patch
    llmcompressor_cpu_pin_memory()
    assert IntermediatesCache.pin_memory is patched  # idempotent

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert patched("cache", 1, x=2) is None and calls == []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert patched("cache", 1, x=2) == "pinned" and calls == [("cache", (1,), {"x": 2})]
