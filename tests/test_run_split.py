"""`eval: {split: ...}` in a suite: validated with the recipe, handed to every eval of the run, and part
of the eval step's key only when it is not the default (so earlier runs' eval steps stay valid)."""

import pytest

from quantkit.errors import RecipeError
from quantkit.recipe.files import recipe_from_dict

STEPS = [{"quantize": {"method": "rtn"}}]


@pytest.mark.parametrize("split", ["all", "selection", "confirmation"])
def test_split_is_a_recipe_key(split):
    assert recipe_from_dict({"steps": STEPS, "eval": {"split": split}}).eval.split == split


def test_a_split_of_generated_text_and_an_unknown_split_are_refused():
    with pytest.raises(RecipeError, match="eval.split"):
        recipe_from_dict({"steps": STEPS, "eval": {"split": "validation"}})
    with pytest.raises(RecipeError, match="no token positions"):
        recipe_from_dict({"steps": STEPS, "eval": {"split": "confirmation", "texts": ["self"]}})


def test_run_scores_the_split_it_names(cli, tiny_llama, tiny_text, tmp_path):
    recipe = tmp_path / "suite.yaml"
    recipe.write_text(
        f"model: {tiny_llama}\ncalibration: {{samples: 4, seq_len: 32}}\n"
        f"eval: {{texts: ['file:{tiny_text}'], seq_len: 32, max_tokens: 128, split: confirmation}}\n"
        "variants:\n  - name: rtn\n    steps: [{quantize: {method: rtn, bits: 8, group_size: -1}}]\n"
    )
    code, _, err, report = cli("run", str(recipe), "--out", str(tmp_path / "run"), "--skip-bench", "--json")
    assert code == 0, err
    ev = report["variants"]["rtn"]["eval"]
    assert ev["split"] == "confirmation"
    lo, hi = ev["texts"][0]["windows"]["token_range"]
    assert lo > 0  # the second half of the held-out first half
