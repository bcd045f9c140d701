"""A suite variant `gguf: {type: T, imatrix: true}`: what a llama.cpp user would make (llama-quantize
with an importance matrix from the run's calibration windows), a report row beside quantkit's
variants at its file size and bits/weight. Validated when the recipe is read; run where the
install built llama.cpp's tools."""

import pytest
import yaml
from installed import llama_tool, needs_llama_cpp

from quantkit.errors import RecipeError
from quantkit.recipe.files import recipe_from_dict

SMALL = [
    "--set",
    "calibration.samples=4",
    "--set",
    "calibration.seq_len=64",
    "--set",
    "eval.seq_len=64",
    "--set",
    "eval.max_tokens=128",
    "--set",
    "bench.prompt_len=16",
    "--set",
    "bench.gen_len=4",
    "--set",
    "bench.repeats=1",
    "--set",
    "bench.min_seconds=0",
]


def _suite(variant: dict) -> dict:
    return {"name": "s", "variants": [{"name": "fp16", "baseline": True}, variant]}


def _read(data: dict):
    return recipe_from_dict(data, "suite.yaml")


@pytest.mark.parametrize(
    "variant, message",
    [
        ({"name": "a", "gguf": {"type": "Q9_K"}}, "variants[1].gguf.type: 'Q9_K'"),
        ({"name": "a", "gguf": {"type": "Q4_K_M", "imatrx": True}}, "imatrx"),
        ({"name": "a", "gguf": {"type": "Q4_K_M"}, "steps": [{"quantize": {"method": "rtn"}}]}, "takes no steps"),
        ({"name": "a", "gguf": {}}, "type"),
        ({"name": "a", "gguf": {"type": "Q4_K_M", "mixed_types": ["Q5_0"]}}, "give it with mixed"),
        ({"name": "a", "gguf": {"type": "Q4_K_M", "mixed": True, "mixed_types": ["Q5_0", "Q9_0"]}}, "Q9_0 is not"),
        ({"name": "a", "gguf": {"type": "Q4_K_M", "mixed": True, "mixed_types": ["Q5_0", "q5_0"]}}, "each once"),
    ],
)
def test_bad_gguf_variants_are_refused_with_their_key(variant, message):
    with pytest.raises(RecipeError) as err:
        _read(_suite(variant))
    assert message in str(err.value) and "\n" not in str(err.value).strip()


def test_a_gguf_variant_needs_no_steps_and_keeps_the_baseline():
    from quantkit.pipeline.run import with_baseline

    recipe = _read({"name": "s", "variants": [{"name": "k", "gguf": {"type": "q4_k_m"}}]})
    assert recipe.variants[0].gguf.type == "Q4_K_M" and recipe.variants[0].gguf.imatrix is True
    assert [v.name for v in with_baseline(recipe)] == ["baseline", "k"]  # a step-less gguf variant is not the baseline


def test_the_built_in_llamacpp_suite_reads():
    from quantkit.recipe.files import load_recipe
    from quantkit.resources import find_recipe

    recipe = load_recipe(find_recipe("demo-llamacpp"))
    kinds = {v.name: (v.gguf.type if v.gguf else None) for v in recipe.variants}
    assert kinds["llamacpp-q4-k-m"] == "Q4_K_M" and recipe.eval.engines == ("llamacpp",)


@needs_llama_cpp
def test_run_reports_the_llama_quantize_variant_beside_quantkits(cli, tiny_llama, tiny_text, tmp_path):
    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "variants": [
                    {
                        "name": "rtn",
                        "steps": [{"quantize": {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True}}],
                    },
                    {"name": "q4km", "gguf": {"type": "Q4_K_M"}},
                ],
                "eval": {"engines": ["llamacpp"]},
                "bench": {"engines": ["llamacpp"]},
                "export": {"formats": ["gguf"]},
            }
        )
    )
    out = tmp_path / "run"
    args = [
        "run",
        str(suite),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--eval-text",
        f"file:{tiny_text}",
        *SMALL,
        "--json",
    ]
    code, _, err, rep = cli(*args)
    assert code == 0, err
    rows = {r["name"]: r for r in rep["rows"]}
    assert set(rows) == {"baseline", "rtn", "q4km"} and all(r["status"] == "ok" for r in rows.values()), rows
    k = rows["q4km"]
    gguf = out / "gguf" / "q4km.gguf"
    assert k["disk_mb"] == pytest.approx(gguf.stat().st_size / 1e6) and 4.0 < k["bits_per_weight"] < 9.0
    assert k["kld_mean"] > 0 and k["tpot_ms"] > 0
    code, _, err, rep2 = cli(*args)
    assert code == 0 and "llama-quantize Q4_K_M: reusing" in err, err
