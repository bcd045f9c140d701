"""quantkit/sensitivity.py and `quantkit sensitivity`: the ranking, the budget, the overrides it prints."""

import pytest
import yaml


def test_greedy_pick_by_kl_per_weight_within_the_budget():
    from quantkit.quantize.sensitivity import greedy_pick, int4_bits, int8_bits

    assert int4_bits(64) == 4.25 and int8_bits(512) == 8.03125
    results = [
        {"layer": 0, "unit": "qkv", "weights": 1000, "in_features": 512, "kl": 0.010},  # 1.0e-5 per weight
        {"layer": 1, "unit": "down", "weights": 4000, "in_features": 512, "kl": 0.020},  # 0.5e-5
        {"layer": 2, "unit": "o", "weights": 500, "in_features": 512, "kl": 0.004},  # 0.8e-5
    ]
    n = 10_000
    # INT8 costs (8.03125 - 4.25) = 3.78125 bits more per weight; budget 4.5 leaves 0.25 * 10000 = 2500 bits:
    # qkv (3781.25) does not fit, o (1890.6) does, down does not.
    picked, bpw = greedy_pick(results, n, 64, 4.5)
    assert [(r["layer"], r["unit"]) for r in picked] == [(2, "o")]
    assert bpw == pytest.approx(4.25 + 3.78125 * 500 / n)
    picked, bpw = greedy_pick(results, n, 64, 6.0)  # 17500 spare bits: qkv, then o; down (15125) no longer fits
    assert [(r["layer"], r["unit"]) for r in picked] == [(0, "qkv"), (2, "o")] and bpw <= 6.0


def test_asymmetric_int4_counts_its_zero_points_in_the_budget():
    """A 4-bit zero point per group: g64 asymmetric is 4.3125 bits/weight, leaving less room for INT8."""
    from quantkit.quantize.sensitivity import greedy_pick, int4_bits

    assert int4_bits(64, symmetric=False) == 4.3125 and int4_bits(32, symmetric=False) == 4.625
    results = [{"layer": 0, "unit": "o", "weights": 600, "in_features": 512, "kl": 0.004}]
    # (8.03125 - 4.25) * 600 = 2268.75 bits fit in 0.25 * 10000 = 2500; (8.03125 - 4.3125) * 600 = 2231.25
    # do not fit in (4.5 - 4.3125) * 10000 = 1875
    assert len(greedy_pick(results, 10_000, 64, 4.5)[0]) == 1
    picked, bpw = greedy_pick(results, 10_000, 64, 4.5, symmetric=False)
    assert picked == [] and bpw == 4.3125


def test_overrides_keep_fused_units_whole(tiny_llama):
    """Pasted into a recipe, the printed overrides validate and pass the vLLM fused-shard check."""
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.preflight import check_fused_shards, meta_model
    from quantkit.recipe.files import recipe_from_dict
    from quantkit.quantize.sensitivity import overrides

    ovs = overrides([{"layer": 1, "unit": "qkv"}, {"layer": 0, "unit": "gate_up"}, {"layer": 1, "unit": "down"}])
    block = yaml.safe_load(yaml.safe_dump({"overrides": ovs}))
    q = recipe_from_dict({"steps": [{"quantize": {"method": "gptq", "bits": 4, "group_size": 64, **block}}]}).steps[0].quantize
    skeleton = meta_model(read_config(tiny_llama))
    check_fused_shards(skeleton, q, "steps[0].quantize")
    from quantkit.quantize.preflight import _override_for

    eight = {n for n, _ in skeleton.named_modules() if _override_for(n, q.overrides) is not None}
    assert eight == {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj",
                     "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.1.mlp.down_proj"}


def test_cli_json_ranks_every_unit_and_fills_the_budget(cli, tiny_llama, tiny_text):
    code, out, err, data = cli("sensitivity", str(tiny_llama), "--budget", "4.6", "--text", f"file:{tiny_text}",
                               "--windows", "2", "--seq-len", "64", "--json")
    assert code == 0, err
    assert len(data["ranking"]) == 2 * 4 and all(r["kl"] > 0 for r in data["ranking"])
    assert [r["kl"] for r in data["ranking"]] == sorted((r["kl"] for r in data["ranking"]), reverse=True)
    assert data["picked"] and 4.25 < data["bits_per_weight"] <= 4.6
    assert data["text"]["region"] == "second-half" and data["text"]["samples"] == 2
    code, out, err, _ = cli("sensitivity", str(tiny_llama), "--budget", "4.8", "--text", f"file:{tiny_text}",
                            "--windows", "2", "--seq-len", "64", "--units", "qkv")  # one q/k/v unit fits in 4.8
    assert code == 0, err
    block = yaml.safe_load(out[out.index("overrides:"):])
    assert block["overrides"][0]["bits"] == 8 and "(q_proj|k_proj|v_proj)$" in block["overrides"][0]["targets"][0]


def test_cli_asymmetric_rounds_and_budgets_with_zero_points(cli, tiny_llama, tiny_text):
    base = ("sensitivity", str(tiny_llama), "--budget", "4.6", "--text", f"file:{tiny_text}", "--windows", "2", "--seq-len", "64", "--json")
    code, _, err, sym = cli(*base)
    assert code == 0, err
    code, _, err, asym = cli(*base, "--asymmetric")
    assert code == 0, err
    assert sym["symmetric"] is True and asym["symmetric"] is False
    assert 4.3125 <= asym["bits_per_weight"] <= 4.6
    # a zero point changes every unit's rounding, so the KLs differ from the symmetric ranking's
    kl = {(r["layer"], r["unit"]): r["kl"] for r in sym["ranking"]}
    assert all(r["kl"] != kl[(r["layer"], r["unit"])] for r in asym["ranking"])


@pytest.mark.parametrize("args,message", [
    (("--budget", "4.0"), "--budget 4.0: between 4.25"),
    (("--budget", "4.3", "--asymmetric"), "--budget 4.3: between 4.3125 (every unit INT4 g64 asymmetric)"),
    (("--budget", "4.5", "--units", "qkv,mlp"), "--units 'qkv,mlp'"),
    (("--budget", "4.5", "--group", "48"), "--group 48"),
    (("--budget", "4.5", "--text", "file:/nonexistent/x.txt"), "no such text file"),
    (("--budget", "4.5", "--device", "cuda:99"), "--device cuda:99"),
])
def test_bad_input_is_one_line(cli, tiny_llama, tiny_text, args, message):
    full = ("sensitivity", str(tiny_llama), "--text", f"file:{tiny_text}", *args)
    code, _, err, _ = cli(*full)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_layers_it_does_not_know_are_one_line():
    import torch

    from quantkit.errors import QuantkitError
    from quantkit.quantize.sensitivity import decoder_layers

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    with pytest.raises(QuantkitError, match="decoder layer 0 has no self_attn.q_proj"):
        decoder_layers(Odd())
    with pytest.raises(QuantkitError, match="no model.layers"):
        decoder_layers(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- noise, context, windows


def _zeroed_unit_checkpoint(tiny_dir, tmp_path):
    """A float32 checkpoint whose layer 0 o_proj is all zeros: INT4 leaves it unchanged, and layer
    0's q/k/v then feed nothing, so both units' measured KL is rounding alone (exactly 0 here), like
    units whose weights sit on the INT4 grid."""
    import torch
    from safetensors.torch import load_file, save_file

    from fixtures import build_checkpoint

    src = build_checkpoint(tmp_path / "zeroed", "llama-gqa", tiny_dir / "tokenizer", dtype="float32")
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros_like(tensors["model.layers.0.self_attn.o_proj.weight"])
    save_file(tensors, shard, metadata={"format": "pt"})
    return src


def test_units_at_noise_level_are_tied_flagged_and_never_picked(cli, tiny_dir, tiny_text, tmp_path):
    src = _zeroed_unit_checkpoint(tiny_dir, tmp_path)
    args = ("sensitivity", str(src), "--budget", "16", "--text", f"file:{tiny_text}", "--windows", "2", "--seq-len", "64")
    code, _, err, data = cli(*args, "--json")
    assert code == 0, err
    floor = data["noise_floor"]
    assert floor["kl"] > 0 and floor["method"] and floor["units_checked_alone"] >= 1
    noisy = [r for r in data["ranking"] if r["below_noise"]]
    assert [(r["layer"], r["unit"]) for r in noisy] == [(0, "qkv"), (0, "o")]  # tied: in layer and unit order
    assert all(r["kl"] == 0.0 and r["kl_measured"] <= r["noise_kl"] for r in noisy)
    assert data["ranking"][-2:] == noisy  # after every measurable unit
    measurable = [r for r in data["ranking"] if not r["below_noise"]]
    assert measurable and all(r["kl_measured"] > r.get("noise_kl", floor["kl"]) for r in measurable)
    picked = {(p["layer"], p["unit"]) for p in data["picked"]}
    assert len(picked) == len(measurable) and not picked & {(0, "qkv"), (0, "o")}  # 16 bits takes every measurable unit
    code, out, err, _ = cli(*args)
    assert code == 0, err
    for unit in ("qkv", "o"):
        row = next(line for line in out.splitlines() if line.split()[1:3] == ["0", unit])
        assert row.split()[0] == "=" and "≤" in row
    assert "cannot be told from rounding" in out and "never negative" in out and "-0.0000" not in out


def test_negative_kl_is_rounding_and_counts_as_zero(tiny_llama):
    """KL >= 0: a negative measured figure sets the noise floor and is never shown or ranked as a value."""
    import torch

    from quantkit.cli.sensitivity import render
    from quantkit.models.checkpoint import load_model
    from quantkit.quantize.sensitivity import _logp, decoder_layers, noise_floor, ranked

    model = load_model(tiny_llama, dtype="float32", device=torch.device("cpu"))
    rows = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    ref = _logp(model, rows)
    layers = decoder_layers(model)
    results = [{"layer": i, "unit": u, "weights": 1000, "in_features": 128, "kl_measured": m, "kl": max(m, 0.0)}
               for i, (u, m) in enumerate([("o", -3e-6), ("down", 0.02)])]
    floor = noise_floor(model, rows, ref, layers, ["o", "down"], results)
    assert floor["most_negative_kl"] == -3e-6 and floor["kl"] >= 3e-6
    low, high = results
    assert low["below_noise"] and low["kl"] == 0.0 and low["noise_kl"] >= 3e-6
    assert not high["below_noise"]
    assert [r["unit"] for r in ranked(results)] == ["down", "o"]
    out = {"text": {"samples": 2, "seq_len": 32, "source": "x"}, "model": "m", "symmetric": True, "group_size": 64, "budget": 4.5,
           "noise_floor": floor, "ranking": ranked(results), "windows": {"note": None}, "picked": [], "bits_per_weight": 4.25,
           "overrides": []}
    text = render(out, 10)
    assert "-0.0000" not in text and "-3" not in text and "≤" in text


def test_greedy_pick_skips_units_below_the_noise():
    from quantkit.quantize.sensitivity import greedy_pick

    results = [{"layer": 0, "unit": "o", "weights": 100, "in_features": 512, "kl": 1e-9, "below_noise": True},
               {"layer": 1, "unit": "o", "weights": 100, "in_features": 512, "kl": 1e-3, "below_noise": False}]
    picked, _ = greedy_pick(results, 10_000, 64, 16.0)
    assert [(r["layer"], r["unit"]) for r in picked] == [(1, "o")]


def test_windows_longer_than_the_context_are_refused(cli, tiny_llama, tiny_text):
    """The fixture's max_position_embeddings is 1024: a longer --seq-len is one line, before loading."""
    code, _, err, _ = cli("sensitivity", str(tiny_llama), "--budget", "4.5", "--text", f"file:{tiny_text}", "--windows", "4",
                          "--seq-len", "2048")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--seq-len 2048" in err and "context of 1024 tokens" in err


def test_fewer_windows_than_asked_are_said(cli, tiny_llama, tiny_text):
    """The second half of the fixture text holds fewer than 1000 windows of 512 tokens: the JSON
    and the text say how many were used and why."""
    args = ("sensitivity", str(tiny_llama), "--budget", "4.5", "--text", f"file:{tiny_text}", "--windows", "1000", "--seq-len", "512",
            "--units", "o")
    code, out, err, data = cli(*args, "--json")
    assert code == 0, err
    w = data["windows"]
    assert w["requested"] == 1000 and 0 < w["used"] < 1000 and w["used"] == data["text"]["samples"]
    assert f"{w['used']} of the 1000 windows asked for" in w["note"] and "second half" in w["note"]
    assert w["note"] in err
    code, out, err, _ = cli(*args)
    assert code == 0 and f"# {w['note']}" in out
    code, _, err, data = cli(*args[:7], "2", *args[8:], "--json")  # windows the text holds: used = requested, no note
    assert code == 0 and data["windows"]["used"] == 2 and data["windows"]["note"] is None
