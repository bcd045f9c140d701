"""quantkit export --format gguf --type T --mixed: each decoder-layer weight's llama.cpp type chosen by
its K-FAC estimated KL within the bytes of T's own file (quantize/kquant_chooser.py, gguf/llama_quantize.py). The
math and the choice on any machine; the whole export with llama.cpp's tools where the install built them."""

import re

import pytest
import torch
from installed import llama_tool

from quantkit.errors import QuantkitError
from quantkit.gguf import llama_quantize
from quantkit.gguf.type_report import LAYER_LINEAR
from quantkit.quantize import kquant_chooser


@pytest.mark.parametrize("rows, cols", [(3, 5), (8, 8), (6, 2)])
def test_kfac_cost_is_the_kronecker_quadratic_form(rows, cols):
    gen = torch.Generator().manual_seed(rows * cols)
    dw = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    x, y = (
        torch.randn(40, cols, generator=gen, dtype=torch.float64),
        torch.randn(40, rows, generator=gen, dtype=torch.float64),
    )
    a, g, tokens = x.T @ x, y.T @ y, 7
    vec = dw.T.reshape(-1)  # column-major vec: vec(G dW A) = (A ⊗ G) vec(dW) for symmetric A
    want = 0.5 * float(vec @ torch.kron(a, g) @ vec) / tokens**2
    assert kquant_chooser.kfac_cost(dw, a, g, tokens) == pytest.approx(want, rel=1e-10)
    assert kquant_chooser.kfac_cost(torch.zeros_like(dw), a, g, tokens) == 0.0


@pytest.mark.parametrize("row", [32, 96, 128, 256, 576, 1536])
def test_a_row_admits_the_types_whose_blocks_divide_it(row):
    got = kquant_chooser.admissible(row, kquant_chooser.MIXABLE)
    blocks = {
        "Q4_0": 32,
        "Q4_1": 32,
        "Q5_0": 32,
        "Q5_1": 32,
        "Q8_0": 32,
        "IQ4_NL": 32,
        "IQ4_XS": 256,
        "Q2_K": 256,
        "Q3_K": 256,
        "Q4_K": 256,
        "Q5_K": 256,
        "Q6_K": 256,
    }
    assert got == [t for t in kquant_chooser.MIXABLE if row % blocks[t] == 0]


def test_type_lists_are_read_case_insensitively_once_each():
    assert kquant_chooser.parse_types("q5_0, Q8_0,q5_0,iq4_nl") == ("Q5_0", "Q8_0", "IQ4_NL")


@pytest.mark.parametrize("bad", ["Q9_Z", "", ",", "Q4_K_M", "F16", "Q5_0,BF16"])
def test_other_type_lists_are_one_line_naming_the_valid_ones(bad):
    with pytest.raises(QuantkitError, match="valid: Q4_0") as err:
        kquant_chooser.parse_types(bad)
    assert "\n" not in str(err.value)


def test_each_tensor_type_pattern_matches_its_own_name_only():
    names = ["blk.1.attn_q.weight", "blk.11.attn_q.weight", "blk.1.attn_q_norm.weight", "token_embd.weight"]
    lines = llama_quantize.type_lines({"blk.1.attn_q.weight": "Q8_0", "token_embd.weight": "Q5_0"}).splitlines()
    assert lines == ["^blk\\.1\\.attn_q\\.weight$=q8_0", "^token_embd\\.weight$=q5_0"]
    for line in lines:
        pattern, _ = line.rsplit("=", 1)
        assert [n for n in names if re.search(pattern, n)] == [pattern[1:-1].replace("\\", "")]


def _instance(seed: int, n: int = 12):
    """Weights with three options each: bytes grow and cost falls with the type, as with real types."""
    gen = torch.Generator().manual_seed(seed)
    weights = {f"blk.{i}.ffn_up.weight": {} for i in range(n)}
    costs = {}
    for name in weights:
        size = int(torch.randint(1, 5, (1,), generator=gen)) * 1024
        scale = float(torch.rand(1, generator=gen)) + 0.01
        costs[name] = {
            "bytes": {"IQ4_NL": size * 18 // 32, "Q5_0": size * 22 // 32, "Q8_0": size * 34 // 32},
            "types": {"IQ4_NL": 3 * scale, "Q5_0": scale, "Q8_0": scale / 30},
        }
    return weights, costs


@pytest.mark.parametrize("seed", range(5))
def test_the_choice_never_passes_the_budget_and_spends_it_on_cost(seed):
    weights, costs = _instance(seed)
    least = sum(min(c["bytes"].values()) for c in costs.values())
    most = sum(max(c["bytes"].values()) for c in costs.values())
    for budget in (least, (least + most) // 2, most):
        picked = kquant_chooser._solve(weights, costs, budget)
        assert sum(costs[n]["bytes"][t] for n, t in picked.items()) <= budget
    # room for all (the knapsack rounds each choice's bytes up to a step of the spare budget: 1% covers it)
    assert set(kquant_chooser._solve(weights, costs, most * 101 // 100).values()) == {"Q8_0"}
    assert set(kquant_chooser._solve(weights, costs, least).values()) == {"IQ4_NL"}
    mid = kquant_chooser._solve(weights, costs, (least + most) // 2)
    assert sum(costs[n]["types"][t] for n, t in mid.items()) < sum(c["types"]["IQ4_NL"] for c in costs.values())


@pytest.mark.parametrize("seed", range(3))
def test_a_budget_below_every_smallest_type_is_refused_before_measuring(seed):
    from types import SimpleNamespace

    _, costs = _instance(seed)
    options = {n: {t: SimpleNamespace(n_bytes=b) for t, b in c["bytes"].items()} for n, c in costs.items()}
    floor = sum(
        -(-min(c["bytes"].values()) // 32) * 32 for c in costs.values()
    )  # each tensor's data padded to 32 bytes
    kquant_chooser._check_floor(options, floor)
    with pytest.raises(QuantkitError, match="add a smaller type") as err:
        kquant_chooser._check_floor(options, floor - 1)
    assert "\n" not in str(err.value)


def test_the_windows_the_choice_is_made_on_are_recorded_for_evals_overlap_check(tiny_llama, tiny_text, tmp_path):
    """The record names the text by its sha256 and each window's start, as a calibration manifest
    does: eval refuses to score the GGUF on them (evals/checks.py reads `mixed.windows`)."""
    from quantkit.data.text import parse_spec, read_text

    o = llama_quantize.KquantOptions("Q4_K_M", calib=f"file:{tiny_text}", seed=3, region="second-half")
    rows, manifest = kquant_chooser._windows(llama_quantize.Made(tmp_path, tiny_llama, {}, None, o, "Q4_K_M"), None)
    assert manifest["sha256"] == read_text(parse_spec(f"file:{tiny_text}")).provenance["sha256"]
    assert (
        len(manifest["window_starts"]) == rows.shape[0] == manifest["samples"] and manifest["seq_len"] == rows.shape[1]
    )


def test_fisher_sums_each_inputs_second_moment_once_and_averages_the_draws(tiny_llama):
    from quantkit.models.checkpoint import load_model

    model = load_model(tiny_llama, dtype="float32", device="cpu")
    attn = model.model.layers[0].self_attn
    mods = {
        "blk.0.attn_q.weight": attn.q_proj,
        "blk.0.attn_k.weight": attn.k_proj,
        "blk.0.attn_output.weight": attn.o_proj,
    }
    rows = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    seen = {}
    hooks = [
        m.register_forward_hook(lambda mod, args, out, n=n: seen.setdefault(n, []).append(args[0].detach()))
        for n, m in (("q", attn.q_proj), ("o", attn.o_proj))
    ]
    with torch.no_grad():
        for w in rows.split(1):
            model(input_ids=w, use_cache=False)
    for h in hooks:
        h.remove()
    a, g = kquant_chooser.fisher(model, rows, mods)
    for key, inputs in (("blk.0.attn_in", seen["q"]), ("blk.0.attn_output", seen["o"])):
        x = torch.cat([t.reshape(-1, t.shape[-1]) for t in inputs])
        assert torch.allclose(a[key], x.T @ x, rtol=1e-4, atol=1e-4)  # once, though q and k both read it
    assert set(a) == {"blk.0.attn_in", "blk.0.attn_output"} and set(g) == set(mods)
    for name, m in mods.items():
        assert g[name].shape == (m.out_features, m.out_features) and torch.allclose(g[name], g[name].T, atol=1e-6)
        assert float(torch.linalg.eigvalsh(g[name].double()).min()) > -1e-6 * float(g[name].abs().max())
    again = kquant_chooser.fisher(model, rows, mods)[1]  # seeded draws: the same statistics twice
    assert all(torch.equal(g[n], again[n]) for n in mods)


def _export(cli, src, out, tiny_text, *extra):
    return cli(
        "export",
        str(src),
        "--format",
        "gguf",
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--calib-samples",
        "4",
        "--calib-seq-len",
        "64",
        *extra,
        "--json",
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--mixed"], "give --type"),
        (["--type", "Q4_K_M", "--mixed-types", "Q5_0,Q8_0"], "--mixed-types applies with --mixed"),
        (["--type", "Q4_K_M", "--mixed-rounding", "gptq"], "--mixed-rounding applies with --mixed"),
        (["--type", "Q4_K_M", "--mixed", "--mixed-types", "Q5_0,Q4_K_M"], "valid: Q4_0"),
    ],
)
def test_mixed_options_out_of_place_are_one_line_and_write_nothing(cli, tiny_llama, tiny_text, tmp_path, args, says):
    out = tmp_path / "out" / "x.gguf"
    code, stdout, stderr, _ = _export(cli, tiny_llama, out, tiny_text, *args)
    assert code == 2 and stderr.count("\n") == 1 and says in stderr, stderr
    assert stdout == "" and not out.parent.exists()


def test_mixed_refuses_an_already_quantized_artifact(cli, tmp_path, tiny_llama, tiny_text):
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    art = tmp_path / "rtn"
    result = CliRunner().invoke(
        group,
        [
            "convert",
            "int4-w4a16-rtn",
            "--model",
            str(tiny_llama),
            "--out",
            str(art),
            "--set",
            "steps[0].quantize.group_size=32",
        ],
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "x.gguf"
    code, _, stderr, _ = _export(cli, art, out, tiny_text, "--type", "Q4_0", "--mixed")
    assert code == 2 and "already quantized" in stderr and "16-bit checkpoint" in stderr and not out.exists(), stderr


@pytest.mark.parametrize("qtype, types", [("Q4_K_M", None), ("Q5_0", "IQ4_NL,Q5_0,Q6_K,Q8_0")])
def test_mixed_export_holds_the_chosen_types_within_the_types_own_size(
    cli, tiny_llama, tiny_text, tmp_path, qtype, types
):
    import gguf

    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    plain = tmp_path / "plain.gguf"
    assert _export(cli, tiny_llama, plain, tiny_text, "--type", qtype)[0] == 0
    out = tmp_path / "out" / "mixed.gguf"
    code, _, stderr, rec = _export(
        cli, tiny_llama, out, tiny_text, "--type", qtype, "--mixed", *(["--mixed-types", types] if types else [])
    )
    assert code == 0, stderr
    allowed = kquant_chooser.parse_types(types) if types else kquant_chooser.DEFAULT_TYPES
    assert out.stat().st_size <= min(plain.stat().st_size, rec["mixed"]["reference_bytes"])
    # the export's own --type file is the plain one but for llama-quantize's header key naming the importance
    # matrix's path
    assert abs(rec["mixed"]["reference_bytes"] - plain.stat().st_size) <= 64
    got = {t.name: (t.tensor_type.name, int(t.shape[0])) for t in gguf.GGUFReader(str(out)).tensors}
    assert {t["name"]: t["type"] for t in rec["tensors"]} == {n: t for n, (t, _) in got.items()}
    layers = [n for n in got if LAYER_LINEAR.fullmatch(n)]
    assert sorted(w["tensor"] for w in rec["mixed"]["weights"]) == sorted(layers)
    for w in rec["mixed"]["weights"]:  # each weight: the chosen type, one of the candidates its rows admit
        kind, row = got[w["tensor"]]
        assert kind == w["type"] and kind in kquant_chooser.admissible(row, allowed) and w["cost"] >= 0
    assert rec["mixed"]["cost_chosen"] == pytest.approx(sum(w["cost"] for w in rec["mixed"]["weights"]))
    assert rec["fallbacks"] == [] and rec["mixed"]["candidates"] == list(allowed)
    g = rec["mixed"]["gptq"]  # the codes chosen again by GPTQ: less error on the calibration inputs
    assert 0 < g["proxy_after"] < g["proxy_before"] and g["windows"] == 4
    assert [w["samples"] for w in rec["mixed"]["windows"]] == [4, 4]  # K-FAC's windows, then GPTQ's
    assert sorted(p.name for p in out.parent.iterdir()) == ["mixed.gguf", "mixed.quantkit.json"]  # nothing left behind


def test_candidates_too_large_for_the_types_size_are_one_line(cli, tiny_llama, tiny_text, tmp_path):
    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    out = tmp_path / "out" / "x.gguf"
    code, _, stderr, _ = _export(cli, tiny_llama, out, tiny_text, "--type", "Q4_0", "--mixed", "--mixed-types", "Q8_0")
    last = stderr.strip().splitlines()[-1]  # after the export's progress lines: one error line, before any measurement
    assert code == 2 and stderr.count("error") == 1 and "add a smaller type" in last and "Fisher" not in stderr, stderr
    assert not out.exists() and sorted(p.name for p in out.parent.iterdir()) == []


def test_llama_quantizes_own_rounding_leaves_the_codes_as_it_made_them(cli, tiny_llama, tiny_text, tmp_path):
    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    out = tmp_path / "plain-codes.gguf"
    code, _, err, rec = _export(
        cli, tiny_llama, out, tiny_text, "--type", "Q5_0", "--mixed", "--mixed-rounding", "llama-quantize"
    )
    assert code == 0, err
    assert "gptq" not in rec["mixed"] and len(rec["mixed"]["windows"]) == 1
