from pathlib import Path

import pytest
from fixtures import RECIPES

from quantkit.errors import RecipeError
from quantkit.recipe.files import apply_override, load_recipe, parse_key_path, recipe_from_dict


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_every_builtin_recipe_validates_by_path_and_by_name(cli):
    paths = sorted((RECIPES).glob("*.yaml"))
    assert len(paths) >= 10
    code, _, err, data = cli("recipe", "validate", *map(str, paths), "--json")
    assert code == 0, err
    assert len(data["valid"]) == len(paths) and data["invalid"] == []
    code, _, err, data = cli("recipe", "validate", *(p.stem for p in paths), "--json")  # built-in names
    assert code == 0 and len(data["valid"]) == len(paths), err


def test_a_recipe_name_that_is_neither_a_file_nor_builtin_is_one_line(cli, tmp_path):
    code, _, err, _ = cli("recipe", "show", "int4-w4a16-gptq-g65")
    assert (
        code == 2
        and "no built-in recipe" in err
        and "int4-w4a16-gptq-g64" in err
        and len(err.strip().splitlines()) == 1
    )
    local = tmp_path / "int4-w4a16-rtn.yaml"  # a file of a built-in's name: the path wins
    local.write_text("description: mine\nsteps:\n  - quantize: {method: rtn, bits: 8, group_size: -1}\n")
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, out, err, _ = cli("recipe", "show", "int4-w4a16-rtn.yaml")
    finally:
        os.chdir(cwd)
    assert code == 0 and '"bits": 8' in out, err


def test_shipped_gqa_suite_includes_its_recipes():
    r = load_recipe(RECIPES / "suite-gqa.yaml")
    kinds = {v.name: [s.kind for s in v.steps] for v in r.variants}
    assert r.variants[0].baseline and not any(v.baseline for v in r.variants[1:])
    assert kinds == {"fp16": [], "int4-awq-gptq-mixed": ["quantize"], "gqa": ["gqa"], "gqa-int4": ["gqa", "quantize"]}
    assert r.variants[2].steps[0].gqa.recover is not None and r.variants[1].steps[0].quantize.auto is not None
    assert (r.bench.engines, r.bench.gen_len, r.bench.repeats) == (("compiled", "llamacpp"), 64, 3)
    # the depth sweep: TPOT at depth up to the demo's 8,192-token context, flash attention on in llama.cpp
    assert r.bench.depths == (0, 1024, 4096, 8128) and max(r.bench.depths) + r.bench.gen_len == 8192
    assert r.bench.flash_attn == "on"


def test_shipped_long_context_suite_holds_the_kv_and_gqa_variants():
    r = load_recipe(RECIPES / "long-context.yaml")
    caches = {v.name: (v.kv_cache.fp8, v.kv_cache.llamacpp) if v.kv_cache else None for v in r.variants}
    assert caches == {
        "fp16": None,
        "int4": None,
        "int4-kv8": ("tensor", "q8_0"),
        "gqa-int4": None,
        "gqa-int4-kv8": ("tensor", "q8_0"),
    }
    assert [s.kind for s in r.variants[-1].steps] == ["gqa", "quantize"]
    assert r.eval.engines == ("transformers", "llamacpp") and r.eval.seq_len == 8192
    assert r.eval.position_buckets == (512, 4096) and r.eval.max_tokens % r.eval.seq_len == 0
    assert r.bench.depths == (0, 4096, 8128) and max(r.bench.depths) + r.bench.gen_len == 8192
    assert r.bench.engines == ("compiled", "llamacpp") and r.bench.flash_attn == "on"


def test_group_size_error_names_file_and_key_path(tmp_path):
    p = write(tmp_path, "steps:\n  - quantize: {method: gptq, group_size: 48}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    assert str(exc.value) == f"{p}: steps[0].quantize.group_size: must be one of 32, 64, 128 or -1"


def test_unknown_key_is_rejected_with_path(tmp_path):
    p = write(tmp_path, "steps:\n  - quantize: {method: rtn}\n  - gqa: {kv_heads: 1, colour: red}\n")
    with pytest.raises(RecipeError, match=r"steps\[1\]\.gqa\.colour: unknown key"):
        load_recipe(p)


def test_method_specific_keys(tmp_path):
    p = write(tmp_path, "steps:\n  - quantize: {method: rtn, actorder: static}\n")
    with pytest.raises(RecipeError, match=r"steps\[0\]\.quantize\.actorder: unknown key"):
        load_recipe(p)


def test_unknown_method_lists_valid_ones(tmp_path):
    p = write(tmp_path, "steps:\n  - quantize: {method: hqq}\n")
    with pytest.raises(RecipeError, match="unknown method 'hqq'; valid methods: rtn, gptq"):
        load_recipe(p)


def test_cross_step_checks():
    with pytest.raises(RecipeError, match="gqa must come before quantize"):
        recipe_from_dict({"steps": [{"quantize": {"method": "rtn"}}, {"gqa": {"kv_heads": 1}}]})
    with pytest.raises(RecipeError, match="exactly one of"):
        recipe_from_dict({"steps": [{}]})
    with pytest.raises(RecipeError, match="either steps"):
        recipe_from_dict({"steps": [{"quantize": {"method": "rtn"}}], "variants": [{"name": "a"}]})


def test_frozen_and_defaults():
    r = recipe_from_dict({"steps": [{"quantize": {"method": "gptq"}}]})
    q = r.steps[0].quantize
    assert (q.bits, q.group_size, q.symmetric, q.ignore) == (4, 128, True, ("lm_head",))
    with pytest.raises(Exception):
        q.bits = 8  # type: ignore[misc]
    assert r.to_dict()["schema_version"] == 1


def test_set_overrides_validated_like_the_file(tmp_path):
    p = write(tmp_path, "steps:\n  - quantize: {method: gptq, group_size: 64}\n")
    r = load_recipe(p, ["steps[0].quantize.group_size=32", "bench.gen_len=16"])
    assert r.steps[0].quantize.group_size == 32 and r.bench.gen_len == 16
    with pytest.raises(RecipeError, match=r"steps\[0\]\.quantize\.group_size: must be one of"):
        load_recipe(p, ["steps[0].quantize.group_size=100"])
    with pytest.raises(RecipeError, match="no list item"):
        load_recipe(p, ["steps[3].quantize.bits=8"])
    with pytest.raises(RecipeError, match="KEY.PATH=VALUE"):
        load_recipe(p, ["steps"])


def test_parse_key_path():
    assert parse_key_path("steps[0].gqa.kv_heads") == ["steps", 0, "gqa", "kv_heads"]
    assert parse_key_path("variants[2].steps[1].quantize.bits") == ["variants", 2, "steps", 1, "quantize", "bits"]
    with pytest.raises(RecipeError):
        parse_key_path("steps[x]")


def test_apply_override_creates_missing_mappings():
    data: dict = {}
    apply_override(data, "eval.tasks=[a, b]")
    assert data == {"eval": {"tasks": ["a", "b"]}}


def test_variant_recipe_include(tmp_path):
    (tmp_path / "q.yaml").write_text("description: inner\nsteps:\n  - quantize: {method: rtn, group_size: 32}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("variants:\n  - name: base\n    baseline: true\n  - name: q\n    recipe: q.yaml\n")
    r = load_recipe(suite)
    assert [v.name for v in r.variants] == ["base", "q"]
    assert r.variants[1].steps[0].quantize.group_size == 32
    assert r.variants[1].description == "inner"


def test_error_in_included_recipe_names_that_file(tmp_path):
    inner = tmp_path / "q.yaml"
    inner.write_text("steps:\n  - quantize: {method: gptq, group_size: 48}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("variants:\n  - name: base\n    baseline: true\n  - name: q\n    recipe: q.yaml\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(suite)
    assert str(exc.value) == (
        f"{inner} (included by {suite}: variants[1].recipe): steps[0].quantize.group_size: "
        "must be one of 32, 64, 128 or -1"
    )


def test_set_error_names_the_set(tmp_path):
    p = write(tmp_path, "steps:\n  - quantize: {method: gptq, group_size: 64}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(p, ["bench.gen_len=16", "steps[0].quantize.group_size=100"])
    assert (
        str(exc.value)
        == "--set steps[0].quantize.group_size=100: steps[0].quantize.group_size: must be one of 32, 64, 128 or -1"
    )
    with pytest.raises(
        RecipeError,
        match=r"^--set steps\[0\]\.quantize=\{method: rtn, colour: red\}: steps\[0\]\.quantize\.colour: unknown key",
    ):
        load_recipe(p, ["steps[0].quantize={method: rtn, colour: red}"])
    with pytest.raises(
        RecipeError, match=rf"^{p}: steps\[0\]\.quantize\.group_size"
    ):  # the file's own error is still the file's
        load_recipe(write(tmp_path, "steps:\n  - quantize: {method: gptq, group_size: 48}\n"), ["bench.gen_len=16"])


def test_invalid_yaml_and_missing_file(tmp_path):
    p = write(tmp_path, "steps: [\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(p)
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(tmp_path / "nope.yaml")


def test_transform_step_kind_order_and_dump(tmp_path):
    p = write(
        tmp_path,
        "steps:\n  - transform: {method: spinquant, transform_type: random-hadamard}\n"
        "  - quantize: {method: autoround, group_size: 64, preset: light}\n",
    )
    r = load_recipe(p)
    assert [s.kind for s in r.steps] == ["transform", "quantize"]
    dumped = r.to_dict()["steps"]
    assert dumped[0]["transform"] == {
        "method": "spinquant",
        "rotations": ["R1", "R2"],
        "transform_type": "random-hadamard",
        "block_size": None,
    }
    assert (dumped[1]["quantize"]["iters"], dumped[1]["quantize"]["lr"]) == (50, 0.005)
    with pytest.raises(RecipeError, match="exactly one of: quantize, gqa, transform"):
        load_recipe(write(tmp_path, "steps:\n  - {transform: {method: spinquant}, quantize: {method: rtn}}\n"))
    with pytest.raises(RecipeError, match="at most one gqa step, one transform step and one quantize step"):
        load_recipe(
            write(
                tmp_path,
                "steps:\n  - transform: {method: spinquant}\n"
                "  - transform: {method: spinquant}\n  - quantize: {method: rtn}\n",
            )
        )


def test_unknown_method_lists_autoround(tmp_path):
    with pytest.raises(RecipeError, match="valid methods: rtn, gptq, awq, autoround, w8a8"):
        load_recipe(write(tmp_path, "steps:\n  - quantize: {method: hqq}\n"))


def test_the_engine_names_a_recipe_takes_are_the_registries():
    """The recipe names the eval scorers it accepts (it is read below their package): they must be
    exactly the registered ones, capabilities included. Its bench engines are the registry itself."""
    from quantkit.bench.engines import ENGINES
    from quantkit.evals.scorers import SCORERS
    from quantkit.recipe.schema import BENCH_ENGINES, EVAL_ENGINES, TASK_ENGINES

    assert BENCH_ENGINES is ENGINES
    assert EVAL_ENGINES == tuple(SCORERS)
    assert TASK_ENGINES == tuple(name for name, scorer in SCORERS.items() if scorer.runs_tasks)
    for name in ENGINES:
        assert recipe_from_dict(
            {"steps": [{"quantize": {"method": "rtn"}}], "bench": {"engine": name}}
        ).bench.engines == (name,)
    for name in SCORERS:
        assert recipe_from_dict(
            {"steps": [{"quantize": {"method": "rtn"}}], "eval": {"engines": [name]}}
        ).eval.engines == (name,)


NUMBERS = {
    "tpot .inf": ("steps[0].quantize.auto={device: h100, budget_tpot_ms: .inf}", "auto.budget_tpot_ms", "finite"),
    "tpot -.inf": ("steps[0].quantize.auto={device: h100, budget_tpot_ms: -.inf}", "auto.budget_tpot_ms", "finite"),
    "tpot .nan": ("steps[0].quantize.auto={device: h100, budget_tpot_ms: .nan}", "auto.budget_tpot_ms", "finite"),
    "bits .nan": ("steps[0].quantize.auto={budget_bits: .nan}", "auto.budget_bits", "finite"),
    "bits true": ("steps[0].quantize.auto={budget_bits: true}", "auto.budget_bits", "not true or false"),
    "windows true": ("steps[0].quantize.auto={budget_bits: 5, windows: true}", "auto.windows", "not true or false"),
    "samples true": ("calibration.samples=true", "calibration.samples", "not true or false"),
    "min_seconds .inf": ("bench.min_seconds=.inf", "bench.min_seconds", "finite"),
    "dampening .nan": ("steps[0].quantize.dampening=.nan", "steps[0].quantize.dampening", "finite"),
}


@pytest.mark.parametrize("kind", list(NUMBERS))
def test_numbers_in_a_recipe_are_finite_and_never_booleans(cli, kind):
    """`.inf`, `.nan` and `true` are YAML values a number field took (`true` as 1): validation
    said ok, and an infinite TPOT budget ended in OverflowError (exit 1) at convert."""
    assignment, key, reason = NUMBERS[kind]
    recipe = "int4-w4a16-gptq-g64" if "dampening" in assignment else "int4-w4a16-rtn"
    code, out, err, _ = cli("recipe", "validate", recipe, "--set", assignment)
    assert code == 2 and key in err and reason in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("where", ["top", "nested", "study"])
def test_a_key_given_twice_is_one_line_naming_it(cli, tmp_path, where):
    """YAML loaders keep the last of two `steps:` without a word: half the recipe was ignored."""
    if where == "study":
        f = tmp_path / "s.yaml"
        f.write_text("name: s\nserver: {engine: custom, command: [x]}\nload: {}\nlevers: []\nload: {}\n")
        code, _, err, _ = cli("levers", str(f), "--dry-run")
        line = 5
    else:
        f = tmp_path / "r.yaml"
        body = (
            "steps:\n  - quantize: {method: rtn}\nsteps:\n  - quantize: {method: gptq}\n"
            if where == "top"
            else "steps:\n  - quantize:\n      method: rtn\n      bits: 4\n      bits: 8\n"
        )
        f.write_text(body)
        code, _, err, _ = cli("recipe", "validate", str(f))
        line = 3 if where == "top" else 5
    key = "load" if where == "study" else "steps" if where == "top" else "bits"
    assert code == 2 and f"duplicate key '{key}'" in err and f"line {line}" in err, err
    assert len(err.strip().splitlines()) == 1
