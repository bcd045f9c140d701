"""quantize/sensitivity.py, quantize/auto.py's search and `quantkit sensitivity`: the rounding, the
measurement from a unit's layer on, the budget, the overrides it prints."""

import pytest
import yaml

from quantkit.methods.schemes import Scheme

BASE, ASYM, INT8, G32 = Scheme(4, 64), Scheme(4, 64, False), Scheme(8, -1), Scheme(4, 32)


def _model(path, dtype="float32"):
    import torch

    from quantkit.models.checkpoint import load_model

    return load_model(path, dtype=dtype, device=torch.device("cpu"))


def _rows(n=2, seq=32):
    import torch

    return torch.randint(0, 300, (n, seq), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("scheme", [INT8, G32, ASYM, Scheme(8, 128, False)])
def test_fake_quant_is_what_llm_compressor_rtn_stores(tiny_llama, scheme):
    """The sensitivity pass rounds a unit as the RTN step rounds it: the same codes, scales and zero points."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    from quantkit.methods.configs import RTNConfig
    from quantkit.methods.llmc import weight_groups
    from quantkit.quantize.sensitivity import fake_quant

    model = _model(tiny_llama)
    w = model.model.layers[1].mlp.down_proj.weight.data.clone()
    cfg = RTNConfig(method="rtn", bits=scheme.bits, group_size=scheme.group_size, symmetric=scheme.symmetric)
    with torch.no_grad():
        oneshot(model=model, recipe=[QuantizationModifier(config_groups=weight_groups(cfg), ignore=["lm_head"])])
    layer = model.model.layers[1].mlp.down_proj
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    stored = fake_quantize(
        layer.weight.data.float(),
        layer.weight_scale.float(),
        layer.weight_zero_point,
        layer.quantization_scheme.weights,
    )
    assert torch.equal(fake_quant(w, scheme), stored.to(w.dtype))
    assert not torch.equal(fake_quant(w, scheme), w)


def test_a_forward_from_the_units_layer_equals_a_full_forward(tiny_dir):
    """Reference.kl(start=i) skips the layers before i with their reference outputs: the KL of a
    unit rounded in layer 1 is the full forward's (evals.stats.kl_full), on every architecture's layers."""
    import torch

    from quantkit.evals.accuracy_stats import kl_full
    from quantkit.quantize.sensitivity import Reference, decoder_layers, fake_quant, unit_modules

    for arch in ("llama-gqa", "qwen2"):
        model, rows = _model(tiny_dir / arch), _rows()
        layers = decoder_layers(model)
        ref = Reference(model, rows, layers)
        with torch.inference_mode():
            before = torch.log_softmax(model(input_ids=rows).logits.float(), -1)
        mods = unit_modules(layers[1], "qkv")
        saved = [m.weight.data for m in mods]
        for m in mods:
            m.weight.data = fake_quant(m.weight.data, BASE)
        with torch.inference_mode():
            full = float(kl_full(before, torch.log_softmax(model(input_ids=rows).logits.float(), -1)).mean())
        assert full > 1e-4 and ref.kl(start=1) == pytest.approx(full, rel=1e-4, abs=1e-7)
        assert ref.kl(start=0) == pytest.approx(full, rel=1e-4, abs=1e-7)
        for m, w in zip(mods, saved):
            m.weight.data = w
        assert abs(ref.kl(start=1)) < 1e-6 and not any(
            "forward" in vars(layer) for layer in layers
        )  # nothing left swapped


def test_kl_terms_match_float64():
    import torch

    from quantkit.quantize.sensitivity import kl_terms

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 7, 500, generator=g) * 6, torch.randn(3, 7, 500, generator=g) * 6
    lp, lq = torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
    truth = (lp.exp() * (lp - lq)).sum(-1)
    shift = torch.logsumexp(a, -1)
    logp = a - shift.unsqueeze(-1)
    p = logp.exp()
    got = (p * logp).sum(-1) + kl_terms(p, p.sum(-1), shift, b)
    assert torch.allclose(got.double(), truth, atol=1e-5) and float(truth.min()) > 0.1


def _search(**kw):
    from quantkit.quantize.auto import Search

    return Search(
        **{
            "base": BASE,
            "choices": (INT8,),
            "units": ("qkv", "o", "gate_up", "down"),
            "budget": 4.5,
            "source_bits": 16,
            **kw,
        }
    )


def test_accounting_counts_every_decoder_linear_at_its_stored_bits(tiny_llama):
    """Candidates at each scheme, other linears at the base, ignored ones at the checkpoint's precision."""
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.auto import accounting, candidates, floor_bits
    from quantkit.quantize.preflight import meta_model
    from quantkit.quantize.sensitivity import decoder_layers

    layers = decoder_layers(meta_model(read_config(tiny_llama)))
    per_layer = 128 * 128 * 2 + 64 * 128 * 2 + 256 * 128 * 3  # q, o; k, v; gate, up, down
    bits, other, total = accounting(layers, _search())
    assert total == 2 * per_layer and other == 0 and len(bits) == 8
    assert bits[(0, "qkv")] == (4.25 * 256 * 128, (8 + 16 / 128) * 256 * 128)
    assert floor_bits(layers, _search()) == 4.25 and floor_bits(layers, _search(base=ASYM)) == 4.3125
    ignored = _search(units=("qkv",), ignore=("lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"))
    bits, other, total = accounting(layers, ignored)
    assert candidates(layers, ignored) == [(0, "qkv"), (1, "qkv")]
    assert other == 4.25 * (2 * per_layer - 2 * 256 * 128 - 256 * 128) + 16 * 256 * 128


def _results(kls, below=()):
    return [
        {
            "layer": i,
            "unit": u,
            "weights": w,
            "kl": k[0],
            "kls": {s.name: v for s, v in zip((BASE, INT8), k)},
            "below_noise": (i, u) in below,
        }
        for (i, u, w), k in kls.items()
    ]


def test_choose_fills_the_budget_by_kl_and_never_raises_a_unit_below_the_noise(tiny_llama):
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.auto import choose
    from quantkit.quantize.preflight import meta_model
    from quantkit.quantize.sensitivity import decoder_layers

    layers = decoder_layers(meta_model(read_config(tiny_llama)))
    # 147,456 weights; INT8 per channel costs 3.875 more bits per weight at 128 columns, 3.8125 at 256 (down):
    # budget 4.6 leaves 0.35 x 294,912 = 103,219 spare bits: one o (16,384 x 3.875 = 63,488) fits, not two
    kls = {(0, "o", 16384): (0.02, 0.0), (1, "o", 16384): (0.03, 0.0), (0, "qkv", 32768): (0.05, 0.0)}
    out = choose(_results(kls), layers, _search(units=("qkv", "o"), budget=4.6))
    assert out["picked"] == [{"layer": 1, "unit": "o", "scheme": "int8"}]
    assert out["bits_per_weight"] == pytest.approx(4.25 + 63488 / 294912) and out["bits_per_weight"] <= 4.6
    out = choose(_results(kls, below={(1, "o")}), layers, _search(units=("qkv", "o"), budget=4.6))
    assert out["picked"] == [{"layer": 0, "unit": "o", "scheme": "int8"}]


def test_overrides_keep_fused_units_whole(tiny_llama):
    """Pasted into a recipe, the printed overrides validate and pass the vLLM fused-shard check."""
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.auto import overrides
    from quantkit.quantize.preflight import check_fused_shards, meta_model
    from quantkit.recipe.files import recipe_from_dict

    picked = [
        {"layer": 1, "unit": "qkv", "scheme": "int8"},
        {"layer": 0, "unit": "gate_up", "scheme": "int4-g32"},
        {"layer": 1, "unit": "down", "scheme": "int8"},
    ]
    ovs = overrides(picked, [INT8, G32])
    block = yaml.safe_load(yaml.safe_dump({"overrides": ovs}))
    q = (
        recipe_from_dict({"steps": [{"quantize": {"method": "gptq", "bits": 4, "group_size": 64, **block}}]})
        .steps[0]
        .quantize
    )
    skeleton = meta_model(read_config(tiny_llama))
    check_fused_shards(skeleton, q, "steps[0].quantize")
    from quantkit.quantize.preflight import _override_for

    raised = {
        n: (ov.bits, ov.group_size)
        for n, _ in skeleton.named_modules()
        if (ov := _override_for(n, q.overrides)) is not None
    }
    assert raised == {
        "model.layers.1.self_attn.q_proj": (8, -1),
        "model.layers.1.self_attn.k_proj": (8, -1),
        "model.layers.1.self_attn.v_proj": (8, -1),
        "model.layers.0.mlp.gate_proj": (4, 32),
        "model.layers.0.mlp.up_proj": (4, 32),
        "model.layers.1.mlp.down_proj": (8, -1),
    }


def test_cli_json_ranks_every_unit_and_fills_the_budget(cli, tiny_llama, tiny_text):
    code, out, err, data = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.6",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--json",
    )
    assert code == 0, err
    assert len(data["ranking"]) == 2 * 4 and all(r["kl"] > 0 for r in data["ranking"])
    assert [r["kl"] for r in data["ranking"]] == sorted((r["kl"] for r in data["ranking"]), reverse=True)
    assert all(set(r["kls"]) == {"int4-g64", "int8"} and r["kls"]["int8"] < r["kl"] for r in data["ranking"])
    assert (
        data["picked"]
        and 4.25 < data["bits_per_weight"] <= 4.6
        and data["base"] == "int4-g64"
        and data["choices"] == ["int8"]
    )
    assert {(p["layer"], p["unit"]) for p in data["picked"]} == {
        (r["layer"], r["unit"]) for r in data["ranking"] if r["chosen"] == "int8"
    }
    assert data["text"]["region"] == "second-half" and data["text"]["samples"] == 2
    code, out, err, _ = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.8",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--units",
        "qkv",
    )  # one q/k/v unit fits in 4.8
    assert code == 0, err
    block = yaml.safe_load(out[out.index("overrides:") :])
    assert block["overrides"][0]["bits"] == 8 and "(q_proj|k_proj|v_proj)$" in block["overrides"][0]["targets"][0]


def test_cli_choices_measure_and_choose_among_several_schemes(cli, tiny_llama, tiny_text):
    args = (
        "sensitivity",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--json",
    )
    code, _, err, data = cli(*args, "--budget", "4.4", "--choices", "int8,int4-g32")
    assert code == 0, err
    assert data["choices"] == ["int8", "int4-g32"] and all(
        set(r["kls"]) == {"int4-g64", "int8", "int4-g32"} for r in data["ranking"]
    )
    # 0.15 spare bits per weight buy no INT8 unit (3.875 more on a sixth of the weights at best) but
    # g32 (0.25 more) on up to 60% of them
    assert data["picked"] and {p["scheme"] for p in data["picked"]} == {"int4-g32"} and data["bits_per_weight"] <= 4.4
    assert all(o["bits"] == 4 and o["group_size"] == 32 for o in data["overrides"])


def test_cli_asymmetric_rounds_and_budgets_with_zero_points(cli, tiny_llama, tiny_text):
    base = (
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.6",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--json",
    )
    code, _, err, sym = cli(*base)
    assert code == 0, err
    code, _, err, asym = cli(*base, "--asymmetric")
    assert code == 0, err
    assert sym["symmetric"] is True and asym["symmetric"] is False and asym["base"] == "int4-g64-asym"
    assert 4.3125 <= asym["bits_per_weight"] <= 4.6
    # a zero point changes every unit's rounding, so the KLs differ from the symmetric ranking's
    kl = {(r["layer"], r["unit"]): r["kl"] for r in sym["ranking"]}
    assert all(r["kl"] != kl[(r["layer"], r["unit"])] for r in asym["ranking"])


@pytest.mark.parametrize(
    "args,message",
    [
        (("--budget", "4.0"), "--budget 4.0: between 4.25 (every unit int4-g64)"),
        (("--budget", "4.3", "--asymmetric"), "--budget 4.3: between 4.3125 (every unit int4-g64-asym)"),
        (
            ("--budget", "4.5", "--choices", "int4-g128"),
            "--choices 'int4-g128': choice 'int4-g128' (4.125 bits/weight) does not raise",
        ),
        (("--budget", "4.5", "--choices", "int8,fp8"), "--choices 'int8,fp8': choice 'fp8'"),
        (("--budget", "4.5", "--units", "qkv,mlp"), "--units 'qkv,mlp'"),
        (("--budget", "4.5", "--group", "48"), "--group 48"),
        (("--budget", "4.5", "--text", "file:/nonexistent/x.txt"), "no such text file"),
        (("--budget", "4.5", "--device", "cuda:99"), "--device cuda:99"),
    ],
)
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
    0's q/k/v then feed nothing, so both units' measured KL is rounding alone (about 1e-7 here), like
    units whose weights sit on the INT4 grid."""
    import torch
    from fixtures import build_checkpoint
    from safetensors.torch import load_file, save_file

    src = build_checkpoint(tmp_path / "zeroed", "llama-gqa", tiny_dir / "tokenizer", dtype="float32")
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros_like(
        tensors["model.layers.0.self_attn.o_proj.weight"]
    )
    save_file(tensors, shard, metadata={"format": "pt"})
    return src


def test_units_at_noise_level_are_tied_flagged_and_never_picked(cli, tiny_dir, tiny_text, tmp_path):
    src = _zeroed_unit_checkpoint(tiny_dir, tmp_path)
    args = (
        "sensitivity",
        str(src),
        "--budget",
        "16",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
    )
    code, _, err, data = cli(*args, "--json")
    assert code == 0, err
    floor = data["noise_floor"]
    assert floor["kl"] > 0 and floor["method"] and floor["units_checked_alone"] >= 1
    noisy = [r for r in data["ranking"] if r["below_noise"]]
    assert [(r["layer"], r["unit"]) for r in noisy] == [(0, "qkv"), (0, "o")]  # tied: in layer and unit order
    assert all(abs(r["kl_measured"]) < 1e-5 and r["kl_measured"] <= r["noise_kl"] for r in noisy)
    assert data["ranking"][-2:] == noisy  # after every measurable unit
    measurable = [r for r in data["ranking"] if not r["below_noise"]]
    assert measurable and all(r["kl_measured"] > r.get("noise_kl", floor["kl"]) for r in measurable)
    picked = {(p["layer"], p["unit"]) for p in data["picked"]}
    assert len(picked) == len(measurable) and not picked & {
        (0, "qkv"),
        (0, "o"),
    }  # 16 bits raises every measurable unit
    code, out, err, _ = cli(*args)
    assert code == 0, err
    for unit in ("qkv", "o"):
        row = next(line for line in out.splitlines() if line.split()[1:3] == ["0", unit])
        assert row.split()[0] == "=" and "≤" in row
    assert "cannot be told from rounding" in out and "never negative" in out and "-0.0000" not in out


def test_negative_kl_is_rounding_and_counts_as_zero(tiny_llama):
    """KL >= 0: a negative measured figure sets the noise floor and is never shown or ranked as a value."""
    from quantkit.cli.sensitivity_cmd import render
    from quantkit.quantize.sensitivity import Reference, decoder_layers, noise_floor, ranked

    model, rows = _model(tiny_llama), _rows()
    ref = Reference(model, rows, decoder_layers(model))
    results = [
        {
            "layer": i,
            "unit": u,
            "weights": 1000,
            "in_features": 128,
            "kl_measured": m,
            "kl": max(m, 0.0),
            "kls_measured": {"int4-g64": m, "int8": m / 10},
            "kls": {"int4-g64": max(m, 0.0), "int8": max(m / 10, 0.0)},
            "chosen": "int4-g64",
        }
        for i, (u, m) in enumerate([("o", -3e-6), ("down", 0.02)])
    ]
    floor = noise_floor(ref, [(0, "o"), (1, "down")], results)
    assert floor["most_negative_kl"] == -3e-6 and floor["kl"] >= 3e-6
    low, high = results
    assert low["below_noise"] and low["kl"] == 0.0 and low["noise_kl"] >= 3e-6
    assert not high["below_noise"]
    assert [r["unit"] for r in ranked(results)] == ["down", "o"]
    out = {
        "text": {"samples": 2, "seq_len": 32, "source": "x"},
        "model": "m",
        "symmetric": True,
        "group_size": 64,
        "budget_bits": 4.5,
        "base": "int4-g64",
        "choices": ["int8"],
        "noise_floor": floor,
        "ranking": ranked(results),
        "windows": {"note": None},
        "picked": [],
        "bits_per_weight": 4.25,
        "overrides": [],
    }
    text = render(out, 10)
    assert "-0.0000" not in text and "-3" not in text and "≤" in text


def test_windows_longer_than_the_context_are_refused(cli, tiny_llama, tiny_text):
    """The fixture's max_position_embeddings is 1024: a longer --seq-len is one line, before loading."""
    code, _, err, _ = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.5",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "4",
        "--seq-len",
        "2048",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--seq-len 2048" in err and "context of 1024 tokens" in err


def test_fewer_windows_than_asked_are_said(cli, tiny_llama, tiny_text):
    """The second half of the fixture text holds fewer than 1000 windows of 512 tokens: the JSON
    and the text say how many were used and why."""
    args = (
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.5",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "1000",
        "--seq-len",
        "512",
        "--units",
        "o",
    )
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


def test_cli_defaults_are_autos():
    """Without options, `quantkit sensitivity` measures what a recipe's bare `auto:` measures."""
    from quantkit.cli.sensitivity_cmd import sensitivity_cmd
    from quantkit.methods.schemes import AutoMixed

    opts = {p.name: p.default for p in sensitivity_cmd.params}
    auto = AutoMixed(budget_bits=4.5)
    assert (opts["windows"], opts["seq_len"], opts["choices"], opts["units_text"], opts["seed"]) == (
        auto.windows,
        auto.seq_len,
        ",".join(auto.choices),
        ",".join(auto.units),
        0,
    )


# ---------------------------------------------------------------- the lazy search convert runs


def _both(model, rows, spec):
    from quantkit.quantize.auto import search

    return search(model, rows, spec), search(model, rows, spec, lazy=True)


def _same_choice(full, lazy):
    assert lazy["picked"] == full["picked"] and lazy["overrides"] == full["overrides"]
    assert lazy["bits_per_weight"] == full["bits_per_weight"] and lazy["kl_sum"] == pytest.approx(
        full["kl_sum"], abs=1e-12
    )
    assert {(r["layer"], r["unit"]): r["kl"] for r in lazy["ranking"]} == {
        (r["layer"], r["unit"]): r["kl"] for r in full["ranking"]
    }


@pytest.mark.parametrize("arch", ["llama-gqa", "qwen2"])
@pytest.mark.parametrize("choices", [(INT8,), (INT8, G32)])
def test_the_lazy_search_chooses_what_measuring_everything_chooses(tiny_dir, arch, choices):
    """Across budgets from the floor to every unit raised: the same units, bits and summed KL; a
    unit whose choices were not measured is one no solution raised; tight budgets of dear choices measure less."""
    model, rows = _model(tiny_dir / arch), _rows()
    for budget in (4.25, 4.4, 4.6, 5.5, 16):
        full, lazy = _both(model, rows, _search(choices=choices, budget=budget))
        _same_choice(full, lazy)
        assert full["measured"]["units_at_every_scheme"] == len(full["ranking"])
        picked = {(p["layer"], p["unit"]) for p in lazy["picked"]}
        assert all(
            len(r["kls_measured"]) == 1 + len(choices) for r in lazy["ranking"] if (r["layer"], r["unit"]) in picked
        )
        if budget == 4.25 or (budget <= 4.4 and choices == (INT8,)):  # a cheap choice (g32) is wanted by many solutions
            assert lazy["measured"]["unit_forwards"] < full["measured"]["unit_forwards"]
        assert lazy["measured"]["solves"] >= 1 and lazy["search"] == "lazy"


def test_the_lazy_search_checks_the_noise_of_what_it_raises(tiny_dir, tmp_path):
    """Units whose KL is rounding alone: never raised by either search; the lazy one checks alone
    only the units under the bound that a solution wanted to raise."""
    model, rows = _model(_zeroed_unit_checkpoint(tiny_dir, tmp_path)), _rows()
    full, lazy = _both(model, rows, _search(budget=16))
    _same_choice(full, lazy)
    assert not {(p["layer"], p["unit"]) for p in lazy["picked"]} & {(0, "qkv"), (0, "o")}
    noisy = {(r["layer"], r["unit"]) for r in lazy["ranking"] if r["below_noise"]}
    assert noisy == {(0, "qkv"), (0, "o")}  # a budget of 16 wants every unit: both checked, both found noise
    assert lazy["noise_floor"]["units_checked_alone"] == full["noise_floor"]["units_checked_alone"]
    tight = _search(budget=4.3)
    _, lazy = _both(model, rows, tight)
    assert lazy["noise_floor"]["units_checked_alone"] <= full["noise_floor"]["units_checked_alone"]


def test_overrides_printed_with_their_windows_make_an_artifact_eval_guards(cli, tiny_llama, tiny_text, tmp_path):
    """The YAML sensitivity prints (overrides, and chosen_on: the windows they were chosen on) goes
    under a recipe's quantize step as it is; the artifact records the windows, and eval refuses to
    score it on them as it refuses its calibration windows."""
    code, out, err, _ = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.8",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "6",
        "--seq-len",
        "64",
    )
    assert code == 0, err
    block = yaml.safe_load(out[out.index("overrides:") :])
    assert block["chosen_on"]["source"] == f"file:{tiny_text}" and len(block["chosen_on"]["window_starts"]) == 6
    recipe = tmp_path / "r.yaml"
    step = {"method": "rtn", "group_size": 64, **block}
    recipe.write_text(yaml.safe_dump({"steps": [{"quantize": step}]}, sort_keys=False))
    art = tmp_path / "art"
    code, _, err, data = cli("convert", str(recipe), "--model", str(tiny_llama), "--out", str(art), "--json")
    assert code == 0, err
    recorded = data["recipe"]["steps"][0]["quantize"]["chosen_on"]
    assert {k: recorded[k] for k in block["chosen_on"]} == block["chosen_on"]
    args = ["eval", str(art), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--seq-len", "64"]
    code, _, err, _ = cli(*args, "--region", "second-half", "--max-tokens", "100000")
    assert code == 2 and "overlap the sensitivity (the overrides' choice) windows" in err, err
    code, _, err, _ = cli(*args, "--region", "first-half", "--max-tokens", "256")
    assert code == 0, err
