"""Where the shipped data is found (quantkit/resources.py) and that the wheel carries all of it (setup.py)."""

import ast
import fnmatch
import subprocess
from pathlib import Path

from fixtures import CALIB_DATA, RECIPES, STUDIES

from quantkit.resources import eval_tasks_dir, find_recipe, find_study, shipped_dir

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("recipes", "studies", "calib_data", "evals")


def _setup_data() -> dict[str, list[str]]:
    tree = ast.parse((REPO / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "DATA")
    return ast.literal_eval(node.value)


def test_a_checkout_reads_the_top_level_directories():
    """An editable install's package is the checkout's quantkit/: its data is the top-level directories."""
    assert not (REPO / "quantkit" / "_data").exists()
    assert [shipped_dir(n) for n in SHIPPED] == [REPO / n for n in SHIPPED]
    assert (RECIPES, STUDIES, CALIB_DATA) == (REPO / "recipes", REPO / "studies", REPO / "calib_data")
    assert find_recipe("int4-w4a16-rtn") == RECIPES / "int4-w4a16-rtn.yaml"
    assert find_study("llamacpp") == STUDIES / "levers-llamacpp.yaml"
    assert (eval_tasks_dir() / "qk_facts.yaml").is_file()


def test_the_wheel_carries_every_shipped_file():
    """Each tracked file under a shipped directory matches one of setup.py's globs for its directory,
    so a new kind of file cannot be left out of the wheel unnoticed (scripts/wheel_smoke.sh builds one)."""
    data = _setup_data()
    assert {d.split("/")[0] for d in data} == set(SHIPPED)
    tracked = subprocess.run(
        ["git", "ls-files", *SHIPPED], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked
    left_out = [
        f for f in tracked if not any(fnmatch.fnmatch(Path(f).name, g) for g in data.get(str(Path(f).parent), []))
    ]
    assert not left_out, f"setup.py's DATA carries none of: {left_out}"
