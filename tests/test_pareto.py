"""`quantkit pareto`: quantkit's points and llama.cpp's at several sizes, the comparison at each
size (pipeline/front.py, pure), the command end to end on a tiny model (pipeline/pareto.py),
bits per weight counted alike for both tools, its refusals and its plan."""

import json

import pytest
from installed import llama_tool, needs_llama_cpp

from quantkit.core.record_checks import RecordError
from quantkit.pipeline.front import DomainKL, ParetoResult, Point, bits_per_weight, compare
from quantkit.pipeline.variant_record import VariantRecord

T1, T2 = "set:a", "set:b"


def _point(line: str, name: str, bpw: float, kl1: float, kl2: float, error: str | None = None) -> Point:
    doms = tuple(DomainKL(t, t[4:], kl, (kl * 0.9, kl * 1.1), 1.0, 0.9, 1024) for t, kl in ((T1, kl1), (T2, kl2)))
    tool = "llama.cpp" if line == "llamacpp" else "quantkit"
    fmt = "compressed-tensors" if line == "compressed-tensors" else "gguf"
    return Point(
        line, name, name, tool, fmt, "llamacpp", None, 1000, 500, 1000, bpw, "exact", () if error else doms, error
    )


POINTS = [
    _point("llamacpp", "llamacpp-IQ4_XS", 4.4, 0.10, 0.20),
    _point("llamacpp", "llamacpp-Q3_K_M", 4.45, 0.30, 0.40),  # larger and worse: never llama.cpp's best
    _point("llamacpp", "llamacpp-Q4_K_M", 5.5, 0.04, 0.05),
    _point("gguf-mixed", "mixed-IQ4_XS", 4.4, 0.05, 0.08),
    _point("gguf-mixed", "mixed-Q4_K_M", 5.5, 0.02, 0.03),
    _point("gguf-mixed", "mixed-Q6_K", 5.9, 0.0, 0.0, error="llama-quantize died"),  # failed: no point
    _point("compressed-tensors", "ct-4.5", 4.5, 0.06, 0.12),
]


def test_at_each_size_each_lines_best_point_no_larger_and_its_kl_ratio():
    at = {c.size: c for c in compare(POINTS, (4.0, 4.5, 6.0))}
    assert all(s is None for s in at[4.0].sides.values()) and at[4.0].best is None
    assert "no line has a point" in at[4.0].verdict
    c = at[4.5]
    ll, mixed, ct = c.side("llamacpp"), c.side("gguf-mixed"), c.side("compressed-tensors")
    assert ll.name == "llamacpp-IQ4_XS" and ll.ratio is None  # worst 0.20, not Q3_K_M's 0.40
    assert mixed.name == "mixed-IQ4_XS" and mixed.ratio == pytest.approx({T1: 0.5, T2: 0.4})
    assert mixed.worst_ratio == pytest.approx(0.4)  # 0.08 / 0.20
    assert ct.ratio == pytest.approx({T1: 0.6, T2: 0.6}) and ct.worst_ratio == pytest.approx(0.6)
    assert c.best == "gguf-mixed" and c.quantkit == "gguf-mixed"
    assert "quantkit (mixed-IQ4_XS) is better" in c.verdict and "× 0.40 (+60% lower)" in c.verdict
    c = at[6.0]
    assert c.side("llamacpp").name == "llamacpp-Q4_K_M" and c.side("gguf-mixed").name == "mixed-Q4_K_M"
    assert c.side("gguf-mixed").worst_ratio == pytest.approx(0.6) and c.side("compressed-tensors").name == "ct-4.5"
    assert c.side("compressed-tensors").worst_ratio == pytest.approx(0.12 / 0.05)


def test_llamacpp_better_and_lines_without_a_point_say_so():
    pts = [_point("llamacpp", "a", 4.0, 0.1, 0.1), _point("compressed-tensors", "b", 4.0, 0.2, 0.15)]
    (c,) = compare(pts, (4.0,))
    assert c.best == "llamacpp" and c.quantkit == "compressed-tensors" and "llama.cpp (a) is better" in c.verdict
    (c,) = compare(pts[1:], (4.0,))
    assert "llama.cpp has no point" in c.verdict
    (c,) = compare(pts[:1], (4.0,))
    assert "quantkit has no point" in c.verdict


def test_bits_per_weight_by_hand():
    assert bits_per_weight(18, 32) == 4.5  # one Q4_0 block: fp16 scale + 16 bytes of codes
    # INT4 g32 symmetric, an (8, 64) linear: 8·64/8 int32 codes, 8·2 fp16 scales = 256 + 32 bytes
    assert bits_per_weight(8 * 64 // 2 + 8 * 2 * 2, 8 * 64) == 4.5
    with pytest.raises(ValueError):
        bits_per_weight(10, 0)


def test_the_result_reads_back_and_refuses_an_unknown_key():
    r = ParetoResult(
        "m",
        "sha",
        "mix:default",
        {},
        "confirmation",
        (T1, T2),
        ("exact",),
        tuple(POINTS),
        tuple(compare(POINTS, (4.5, 6.0))),
        "bytes × 8 ÷ weights",
        (),
        1.0,
    )
    data = json.loads(json.dumps(r.to_json()))
    assert ParetoResult.from_json(data) == r
    data["points"][0]["surprise"] = 1
    with pytest.raises(RecordError, match="surprise"):
        ParetoResult.from_json(data)


def _pareto(cli, tiny_llama, tiny_text, out, *extra):
    return cli(
        "pareto",
        str(tiny_llama),
        "--calib",
        f"file:{tiny_text}",
        "--out",
        str(out),
        "--text",
        f"file:{tiny_text}",
        "--calib-samples",
        "4",
        "--calib-seq-len",
        "64",
        "--seq-len",
        "64",
        "--max-tokens",
        "128",
        *extra,
        "--json",
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--anchors", "Q4_K_M,Q9_K"], "--anchors Q9_K: not a type"),
        (["--sizes", "2.5,4"], "--sizes 2.5: sizes are bits/weight between 3 and 8.5"),
        (["--sizes", "9"], "between 3 and 8.5"),
        (["--sizes", "four"], "--sizes 'four': expected comma-separated numbers"),
        (["--lines", "llamacpp,exllama"], "--lines exllama: not a line"),
        (["--mixed-types", "Q4_K,Q9_0"], "--mixed-types Q9_0"),
    ],
)
def test_refusals_are_one_line_and_make_nothing(cli, tiny_llama, tiny_text, tmp_path, args, says):
    out = tmp_path / "front"
    code, stdout, stderr, _ = _pareto(cli, tiny_llama, tiny_text, out, *args)
    assert code == 2 and stderr.count("\n") == 1 and says in stderr, stderr
    assert stdout == "" and not out.exists()


def test_without_llama_cpps_tools_the_gguf_lines_are_refused(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "no-tools"))
    out = tmp_path / "front"
    code, _, stderr, _ = _pareto(cli, tiny_llama, tiny_text, out, "--sizes", "4.5")
    assert code == 2 and stderr.count("\n") == 1 and "llama-quantize is not installed" in stderr, stderr
    assert not out.exists()


@needs_llama_cpp
def test_the_front_end_to_end_two_sizes_one_anchor(cli, tiny_llama, tiny_text, tmp_path):
    """Q5_0 (5.5 bits/weight on the tiny model's rows) as the anchor, --mixed at its size, auto at 4.5
    and 5.5: every point scored on the confirmation windows, none on a window a choice was fitted on."""
    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    out = tmp_path / "front"
    code, _, err, rep = _pareto(cli, tiny_llama, tiny_text, out, "--sizes", "4.5,5.5", "--anchors", "Q5_0")
    assert code == 0, err
    points = {p["name"]: p for p in rep["points"]}
    assert set(points) == {"llamacpp-Q5_0", "mixed-Q5_0", "ct-4.5", "ct-5.5"}
    assert all(p["error"] is None for p in points.values()), points
    for p in points.values():
        assert p["kl_kind"] == rep["kl_kinds"][0] and len(p["domains"]) == 1
        d = p["domains"][0]
        assert d["ci95"][0] <= d["kl"] <= d["ci95"][1] and p["worst_kl"] == d["kl"]
        assert p["bits_per_weight"] == pytest.approx(8 * p["layer_bytes"] / p["layer_weights"])
    assert points["llamacpp-Q5_0"]["engine"] == "llamacpp" and points["ct-4.5"]["engine"] == "transformers"
    assert points["llamacpp-Q5_0"]["bits_per_weight"] == 5.5 >= points["mixed-Q5_0"]["bits_per_weight"]
    assert points["ct-4.5"]["bits_per_weight"] <= 4.5 and points["ct-5.5"]["bits_per_weight"] <= 5.5
    c45, c55 = rep["comparisons"]
    assert c45["size"] == 4.5 and c45["sides"]["llamacpp"] is None and c45["sides"]["gguf-mixed"] is None
    assert c45["sides"]["compressed-tensors"]["name"] == "ct-4.5" and "llama.cpp has no point" in c45["verdict"]
    assert c55["sides"]["llamacpp"]["name"] == "llamacpp-Q5_0"
    side = c55["sides"]["gguf-mixed"]
    assert side["worst_ratio"] == pytest.approx(points["mixed-Q5_0"]["worst_kl"] / points["llamacpp-Q5_0"]["worst_kl"])
    assert c55["sides"]["compressed-tensors"]["name"] in ("ct-4.5", "ct-5.5")
    assert (out / "pareto.png").stat().st_size > 5000 and (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "pareto.md").read_text()
    assert "mixed-Q5_0" in table and "## At each size" in table
    assert ParetoResult.from_json(json.loads((out / "pareto.json").read_text())).points[0].name in points
    code, _, err, again = _pareto(cli, tiny_llama, tiny_text, out, "--sizes", "4.5,5.5", "--anchors", "Q5_0")
    assert code == 0 and "reusing" in err and "llama-imatrix" not in err, err
    assert [p["worst_kl"] for p in again["points"]] == [p["worst_kl"] for p in rep["points"]]


@needs_llama_cpp
def test_bits_per_weight_are_counted_alike_for_a_gguf_and_a_compressed_tensors_artifact(
    cli, tiny_llama, tiny_text, tmp_path
):
    """INT4 g32 symmetric (4 bits + an fp16 scale per 32) and Q4_0 (16 bytes of codes + an fp16 scale
    per 32) store the same 4.5 bits per weight: the command counts both as 4.5, over the same weights."""
    from quantkit.pipeline.pareto import point

    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    art = tmp_path / "rtn"
    code, _, err, _ = cli(
        "convert",
        "int4-w4a16-rtn",
        "--model",
        str(tiny_llama),
        "--out",
        str(art),
        "--set",
        "steps[0].quantize.group_size=32",
        "--set",
        "steps[0].quantize.symmetric=true",
        "--json",
    )
    assert code == 0, err
    gguf = tmp_path / "q4_0.gguf"
    code, _, err, rec = cli(
        "export",
        str(tiny_llama),
        "--format",
        "gguf",
        "--type",
        "Q4_0",
        "--out",
        str(gguf),
        "--calib",
        f"file:{tiny_text}",
        "--calib-samples",
        "4",
        "--calib-seq-len",
        "64",
        "--json",
    )
    assert code == 0, err
    ct = point("ct-4.5", VariantRecord("ct-4.5", artifact=str(art)))
    made = {"gguf": str(gguf), "gguf_type": "Q4_0", "bytes": rec["bytes"]}
    gg = point("llamacpp-Q4_0", VariantRecord("llamacpp-Q4_0", gguf_variant=made))
    assert (
        ct.layer_weights
        == gg.layer_weights
        == 2 * sum(o * i for o, i in ((128, 128), (64, 128), (64, 128), (128, 128), (256, 128), (256, 128), (128, 256)))
    )
    assert ct.bits_per_weight == gg.bits_per_weight == 4.5
    assert gg.layer_bytes == ct.layer_bytes == gg.layer_weights // 32 * 18


def test_plan_costs_every_point_and_makes_nothing(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    tools = tmp_path / "tools"  # the plan checks that the tools exist; it runs none of them
    tools.mkdir()
    for name in ("llama-quantize", "llama-imatrix"):
        (tools / name).write_text("#!/bin/sh\nexit 1\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tools))
    pytest.importorskip("llama_cpp")
    out = tmp_path / "front"
    code, _, err, plan = _pareto(
        cli, tiny_llama, tiny_text, out, "--sizes", "3.5,4.5,5.5", "--anchors", "Q5_0", "--plan"
    )
    assert code == 0, err
    steps = plan["time_breakdown"]
    assert set(steps) == {
        "fp16:eval",
        "llamacpp-Q5_0:export",
        "llamacpp-Q5_0:eval",
        "ct-4.5:convert",
        "ct-4.5:eval",
        "ct-5.5:convert",
        "ct-5.5:eval",
        "mixed-Q5_0:export",
        "mixed-Q5_0:eval",
    }
    assert plan["command"] == "pareto" and plan["seconds"] == pytest.approx(sum(steps.values()), abs=1)
    assert steps["mixed-Q5_0:export"] > steps["llamacpp-Q5_0:export"] > 0  # the choice and GPTQ on top
    assert any("no point at 3.5" in n for n in plan["notes"]) and not out.exists()
