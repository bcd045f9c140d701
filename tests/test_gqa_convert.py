"""The gqa step through `quantkit convert` on tiny checkpoints: stock output, exactness, bad input."""

import json
from pathlib import Path

import pytest
import torch
from fixtures import RECIPES

SMALL = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]
NO_RECOVER = ["--set", "steps[0].gqa.recover=null"]

# Architectures beyond the shared fixtures: same projection layout, some with per-head q/k norms.
EXTRA = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"sliding_window": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {"use_bias": True}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 2, "num_experts_per_tok": 1}),
}


def build(
    out: Path, tokenizer_dir: Path, cfg_name: str, model_name: str, extra: dict, dtype=torch.float16, edit=None
) -> Path:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = getattr(transformers, cfg_name)(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=extra.pop("num_key_value_heads", 2),
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **extra,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
        if edit:
            edit(model)
    model.to(dtype).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def convert(cli, model, out, text, *extra, recipe="gqa"):
    return cli(
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(model),
        "--out",
        str(out),
        "--calib",
        f"file:{text}",
        *SMALL,
        *extra,
        "--json",
    )


def gqa_set(**kw):
    return [a for k, v in kw.items() for a in ("--set", f"steps[0].gqa.{k}={v}")]


def load_stock(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def logits(model, n=2, length=48, seed=0):
    ids = torch.randint(0, model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        return model(input_ids=ids).logits


def mean_kl(ref, new):
    return float((ref.log_softmax(-1).exp() * (ref.log_softmax(-1) - new.log_softmax(-1))).sum(-1).mean())


@pytest.mark.parametrize(
    "arch,kv,merge,grouping",
    [
        ("llama-mha", 2, "calibrated", "searched"),
        ("llama-mha", 1, "mean", "contiguous"),
        ("llama-gqa", 1, "calibrated", "contiguous"),
        ("mistral", 1, "calibrated", "contiguous"),
        ("qwen2", 1, "calibrated", "searched"),
    ],
)
def test_fixture_converts_to_a_stock_checkpoint(cli, tiny_dir, tiny_text, tmp_path, arch, kv, merge, grouping):
    out = tmp_path / "art"
    code, _, err, data = convert(
        cli, tiny_dir / arch, out, tiny_text, *NO_RECOVER, *gqa_set(kv_heads=kv, merge=merge, grouping=grouping)
    )
    assert code == 0, err
    g = data["gqa"]
    assert g["kv_heads_after"] == kv and g["merge"] == merge and len(g["groups"]) == 2
    assert g["kv_bytes_per_token_after"] * g["kv_heads_before"] == g["kv_bytes_per_token_before"] * kv
    assert data["verification"]["status"] == "passed"
    cfg, src_cfg = (
        json.loads((out / "config.json").read_text()),
        json.loads((tiny_dir / arch / "config.json").read_text()),
    )
    changed = {k for k in cfg if cfg[k] != src_cfg.get(k)} - {"transformers_version"}
    assert changed == {"num_key_value_heads"} and "auto_map" not in cfg
    model = load_stock(out)
    attn = model.model.layers[0].self_attn
    assert model.config.num_key_value_heads == kv and attn.k_proj.weight.shape == (kv * 32, 128)
    assert attn.v_proj.weight.shape == (kv * 32, 128) and attn.q_proj.weight.shape == (128, 128)
    assert (attn.k_proj.bias is not None) == (arch == "qwen2")
    assert torch.isfinite(logits(model)).all()


@pytest.mark.parametrize("arch", list(EXTRA))
def test_other_architectures_mean_merge(cli, tiny_dir, tiny_text, tmp_path, arch):
    src = build(tmp_path / arch, tiny_dir / "tokenizer", *[dict(x) if isinstance(x, dict) else x for x in EXTRA[arch]])
    out = tmp_path / "art"
    code, _, err, data = convert(
        cli, src, out, tiny_text, *NO_RECOVER, *gqa_set(kv_heads=1, merge="mean", grouping="contiguous")
    )
    assert code == 0, err
    model = load_stock(out)
    assert model.config.num_key_value_heads == 1 and model.model.layers[1].self_attn.k_proj.weight.shape[0] == 16
    assert torch.isfinite(logits(model)).all()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "olmo2"])
def test_per_head_norm_models_refuse_calibrated(cli, tiny_dir, tiny_text, tmp_path, arch):
    src = build(tmp_path / arch, tiny_dir / "tokenizer", *[dict(x) if isinstance(x, dict) else x for x in EXTRA[arch]])
    code, _, err, _ = convert(cli, src, tmp_path / "x", tiny_text, *gqa_set(kv_heads=1, merge="calibrated"))
    assert code == 2 and "steps[0].gqa.merge" in err and "use merge: mean" in err and not (tmp_path / "x").exists()


def duplicate_heads(pairs):
    """An edit that makes the KV heads in each pair identical (k and v projections, and biases)."""

    def edit(model):
        for layer in model.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                for t in [proj.weight] + ([proj.bias] if proj.bias is not None else []):
                    d = t.shape[0] // 4
                    for a, b in pairs:
                        t[b * d : (b + 1) * d] = t[a * d : (a + 1) * d]

    return edit


@pytest.mark.parametrize(
    "merge,grouping,pairs",
    [
        ("mean", "contiguous", [(0, 1), (2, 3)]),
        ("calibrated", "contiguous", [(0, 1), (2, 3)]),
        ("calibrated", "searched", [(0, 2), (1, 3)]),  # non-contiguous: realised by permuting q rows / o columns
        ("mean", "searched", [(0, 3), (1, 2)]),
    ],
)
def test_identical_heads_convert_exactly(cli, tiny_dir, tiny_text, tmp_path, merge, grouping, pairs):
    src = build(
        tmp_path / "dup",
        tiny_dir / "tokenizer",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"num_key_value_heads": 4},
        dtype=torch.float32,
        edit=duplicate_heads(pairs),
    )
    out = tmp_path / "art"
    code, _, err, data = convert(
        cli, src, out, tiny_text, *NO_RECOVER, *gqa_set(kv_heads=2, merge=merge, grouping=grouping)
    )
    assert code == 0, err
    assert data["gqa"]["groups"] == [[list(p) for p in pairs]] * 2
    ref, new = logits(load_stock(src)), logits(load_stock(out))
    assert (ref - new).abs().max() < 1e-4


def test_mean_matches_a_plain_reference(cli, tiny_dir, tiny_text, tmp_path):
    src, out = tiny_dir / "llama-mha", tmp_path / "art"
    code, _, err, _ = convert(
        cli, src, out, tiny_text, *NO_RECOVER, *gqa_set(kv_heads=2, merge="mean", grouping="contiguous")
    )
    assert code == 0, err
    a, b = load_stock(src), load_stock(out)
    for la, lb in zip(a.model.layers, b.model.layers):
        for name in ("k_proj", "v_proj"):
            w = getattr(la.self_attn, name).weight.reshape(2, 2, 32, 128).mean(1).reshape(64, 128)
            assert torch.allclose(getattr(lb.self_attn, name).weight, w.half().float())
        assert torch.equal(la.self_attn.q_proj.weight, lb.self_attn.q_proj.weight)
        assert torch.equal(la.self_attn.o_proj.weight, lb.self_attn.o_proj.weight)


def test_calibrated_beats_mean(cli, tiny_dir, tiny_text, tmp_path):
    from transformers import AutoTokenizer

    src, kls = tiny_dir / "llama-mha", {}
    ids = AutoTokenizer.from_pretrained(str(src))(tiny_text.read_text()[:4000])["input_ids"][:256]
    ids = torch.tensor(ids).reshape(4, 64)  # first half of the text: not what the merge calibrated on
    for merge in ("mean", "calibrated"):
        code, _, err, _ = convert(cli, src, tmp_path / merge, tiny_text, *NO_RECOVER, *gqa_set(kv_heads=1, merge=merge))
        assert code == 0, err
        with torch.inference_mode():
            kls[merge] = mean_kl(load_stock(src)(ids).logits, load_stock(tmp_path / merge)(ids).logits)
    assert kls["calibrated"] < kls["mean"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(kv_heads=3), "steps[0].gqa.kv_heads: 3 does not divide the 4 query heads"),
        (dict(kv_heads=2), "steps[0].gqa.kv_heads: 2 is not below the model's 2 KV heads"),
    ],
)
def test_bad_kv_heads_before_any_work(cli, tiny_llama, tiny_text, tmp_path, monkeypatch, overrides, message):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    code, _, err, _ = convert(cli, tiny_llama, tmp_path / "x", tiny_text, *gqa_set(**overrides))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_gpt2_style_mha_is_a_clear_error(cli, tiny_dir, tiny_text, tmp_path, monkeypatch):
    import transformers

    import quantkit.quantize.convert as qc

    src = tmp_path / "gpt2"
    cfg = transformers.GPT2Config(vocab_size=384, n_embd=64, n_layer=1, n_head=4, n_positions=128)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(str(src))
    transformers.AutoTokenizer.from_pretrained(str(tiny_dir / "tokenizer")).save_pretrained(str(src))
    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    code, _, err, _ = convert(cli, src, tmp_path / "x", tiny_text)
    assert (
        code == 2 and "does not support model_type 'gpt2' (fused c_attn projection" in err and "supported: llama" in err
    )


def test_recover_summary_and_token_bound(cli, tiny_llama, tiny_text, tmp_path):
    rec = "{tokens: 1024, max_minutes: 5, seq_len: 32, batch_size: 4, eval_every: 4, heldout_windows: 2}"
    code, _, err, data = convert(cli, tiny_llama, tmp_path / "a", tiny_text, "--set", f"steps[0].gqa.recover={rec}")
    assert code == 0, err
    r = data["gqa"]["recover"]
    assert r["stop"] == "tokens" and r["steps"] == 8 and r["tokens"] == 1024
    assert [s for s, _ in r["heldout_kl"]] == [0, 4, 8]
    assert min(k for _, k in r["heldout_kl"]) < r["heldout_kl"][0][1]
    assert r["windows"]["heldout"] == 2 and r["minutes"] < 5


def test_recover_time_bound(cli, tiny_llama, tiny_text, tmp_path):
    rec = "{tokens: 10000000, max_minutes: 0.03, seq_len: 32, batch_size: 2}"
    code, _, err, data = convert(cli, tiny_llama, tmp_path / "a", tiny_text, "--set", f"steps[0].gqa.recover={rec}")
    assert code == 0, err
    r = data["gqa"]["recover"]
    assert r["stop"] == "time" and r["minutes"] <= 0.03 * 1.5 + 0.02


def test_recover_text_too_short(cli, tiny_llama, tmp_path, monkeypatch):
    from fixtures import synthetic_text

    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    text = tmp_path / "short.txt"
    text.write_text(synthetic_text(300))
    code, _, err, _ = convert(cli, tiny_llama, tmp_path / "a", text, "--set", "steps[0].gqa.recover.seq_len=512")
    assert code == 2 and "steps[0].gqa.recover: calibration text too short" in err and not (tmp_path / "a").exists()
    assert len(err.strip().splitlines()) == 1


def test_recover_self_text_too_short(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "gqa.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--calib",
        "self",
        *SMALL,
        "--set",
        "steps[0].gqa.recover.seq_len=128",
    )
    assert (
        code == 2
        and "steps[0].gqa.recover: 0 windows of 128 tokens from the calibration samples; need at least 8" in err
    )


def test_recovery_text_preflight_matches_the_runtime_count(tiny_llama, tiny_text, tmp_path):
    """The preflight's arithmetic agrees with the windows recovery really cuts (text and self)."""
    from types import SimpleNamespace

    from quantkit.errors import DataError
    from quantkit.gqa.gqa_step import preflight_recovery_text, recovery_windows
    from quantkit.models.checkpoint import load_tokenizer
    from quantkit.recipe.schema import CalibrationConfig, RecoverConfig

    tok = load_tokenizer(tiny_llama)
    short = tmp_path / "short.txt"
    short.write_text(tiny_text.read_text()[:3000])
    calibration = CalibrationConfig(samples=3, seq_len=64)
    samples = SimpleNamespace(samples=[torch.zeros(1, 64, dtype=torch.long)] * 3, manifest={})
    outcomes = set()
    for seq_len in (16, 32, 64):
        for heldout in (1, 4, 8):
            rec = RecoverConfig(seq_len=seq_len, heldout_windows=heldout, batch_size=4)
            for spec, calib_set in ((f"file:{short}", None), ("self", samples)):
                try:
                    recovery_windows(tok, spec, rec, calib_set, "k")
                    ok = True
                except DataError:
                    ok = False
                try:
                    preflight_recovery_text(tok, spec, rec, calibration, "k")
                    assert ok, (spec, seq_len, heldout)
                except DataError:
                    assert not ok, (spec, seq_len, heldout)
                outcomes.add((spec, ok))
    assert len(outcomes) == 4  # both outcomes seen for both kinds of text


@pytest.mark.parametrize("recipe", ["gqa", "gqa-int4"])
def test_shipped_recipes_on_a_fixture(cli, tiny_dir, tiny_text, tmp_path, recipe):
    out = tmp_path / recipe
    quick = ["--set", "steps[0].gqa.recover.tokens=2048", "--set", "steps[0].gqa.recover.seq_len=32"]
    code, _, err, data = convert(cli, tiny_dir / "llama-mha", out, tiny_text, *quick, recipe=recipe)
    assert code == 0, err
    assert data["gqa"]["kv_heads_after"] == 1 and data["gqa"]["recover"]["steps"] >= 1
    assert data["verification"]["status"] == "passed"
    assert json.loads((out / "config.json").read_text())["num_key_value_heads"] == 1
    if recipe == "gqa-int4":
        assert data["quantization"]["weight_bits"] == 4
        assert "quantization_config" in json.loads((out / "config.json").read_text())


def test_recovery_windows_are_recorded_and_the_eval_guard_covers_them(cli, tiny_llama, tiny_text, tmp_path):
    """Recovery trains on the second half of the text: quantkit.json records those windows, and
    `eval --region second-half` on the same text is refused (it once scored on training text)."""
    import hashlib

    rec = "{tokens: 1024, max_minutes: 5, seq_len: 32, batch_size: 4, eval_every: 4, heldout_windows: 2}"
    out = tmp_path / "a"
    code, _, err, data = convert(
        cli,
        tiny_llama,
        out,
        tiny_text,
        "--set",
        f"steps[0].gqa.recover={rec}",
        "--set",
        "calibration.region=first-half",
    )
    assert code == 0, err
    w = data["gqa"]["recover"]["windows"]
    assert w["sha256"] == hashlib.sha256(tiny_text.read_bytes()).hexdigest() and w["source"] == f"file:{tiny_text}"
    assert w["seq_len"] == 32 and w["heldout"] == 2 and len(w["heldout_starts"]) == 2
    assert w["train_used"] == len(w["train_starts"]) == 8 * 4 and w["train"] >= w["train_used"]
    starts = w["train_starts"] + w["heldout_starts"]
    assert (
        min(starts) >= w["stream_tokens"] // 2
        and len(set(starts)) == len(starts)
        and not set(w["train_starts"]) & set(w["heldout_starts"])
    )
    assert json.loads((out / "quantkit.json").read_text())["gqa"]["recover"]["windows"] == w
    args = [
        "eval",
        str(out),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "4096",
    ]
    code, _, err, _ = cli(*args, "--region", "second-half")
    assert code == 2 and "overlap the GQA recovery training windows" in err and "--allow-overlap" in err
    code, _, err, ev = cli(*args, "--region", "second-half", "--allow-overlap", "--json")
    assert code == 0, err
    assert ev["overlap_check"] == {"allowed": True}
