import json

import pytest

from quantkit.errors import ModelError, OfflineError
from quantkit.models import check_checkpoint, checkpoint_hash, resolve_model


def test_local_dir_resolves(tiny_llama):
    assert resolve_model(str(tiny_llama)) == tiny_llama.resolve()


def test_missing_dir_and_bad_ref(tmp_path):
    with pytest.raises(ModelError, match="no such directory"):
        resolve_model(str(tmp_path / "nope"))


def test_hub_id_offline_is_clear(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises((OfflineError, ModelError), match="Hugging Face Hub|offline"):
        resolve_model("someorg/somemodel-that-does-not-exist")


def test_pickle_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ModelError, match="--allow-pickle"):
        check_checkpoint(tmp_path)
    check_checkpoint(tmp_path, allow_pickle=True)


def test_truncated_safetensors(tmp_path, tiny_llama):
    import shutil

    dst = tmp_path / "m"
    shutil.copytree(tiny_llama, dst)
    st = dst / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="truncated"):
        check_checkpoint(dst)
    st.write_bytes(b"garbage")
    with pytest.raises(ModelError, match="not a valid safetensors"):
        check_checkpoint(dst)


def test_no_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        check_checkpoint(tmp_path)


def test_checkpoint_hash_is_stable(tiny_llama):
    assert checkpoint_hash(tiny_llama) == checkpoint_hash(tiny_llama)
    assert len(checkpoint_hash(tiny_llama)) == 64


def test_cast_model_keeps_rope_frequencies_in_float32(tiny_llama):
    import torch

    from quantkit.models import cast_model, load_model

    model = cast_model(load_model(tiny_llama, dtype="float32"), torch.float16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float16
    assert {n for n, _ in model.named_buffers()} == {n for n, _ in load_model(tiny_llama, dtype="float16").named_buffers()}


def test_cast_model_keeps_exact_rope_frequencies_after_offload(tiny_llama):
    """After llm-compressor's oneshot, module buffer dicts are compressed-tensors OffloadCaches whose
    assignment copies in place: without a copy, inv_freq came back rounded to fp16 and a W8A8 demo
    artifact failed its own reload check (mean KL 0.01; dynamic activation rounding amplifies it)."""
    import torch
    from compressed_tensors.offload import offload_module

    from quantkit.models import cast_model, load_model

    exact = load_model(tiny_llama, dtype="float32").model.rotary_emb.inv_freq.clone()
    assert not torch.equal(exact, exact.half().float())  # the check below can fail
    model = load_model(tiny_llama, dtype="float32")
    offload_module(model.model.rotary_emb, "cpu", "cpu")
    model = cast_model(model, torch.float16)
    assert torch.equal(model.model.rotary_emb.inv_freq, exact)
