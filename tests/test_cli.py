"""The CLI skeleton: recipe commands through --json, one-line errors with exit code 2."""

from fixtures import RECIPES


def test_recipe_validate_json(cli):
    code, out, err, data = cli("recipe", "validate", str(RECIPES / "int4-w4a16-rtn.yaml"), "--json")
    assert code == 0
    assert data["valid"][0]["name"] == "int4-w4a16-rtn"


def test_recipe_validate_error_is_one_line_exit_2(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - quantize: {method: gptq, group_size: 100}\n")
    code, out, err, _ = cli("recipe", "validate", str(bad))
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"error: {bad}: steps[0].quantize.group_size: must be one of 32, 64, 128 or -1"]
    assert "Traceback" not in err


def test_recipe_list_json(cli):
    code, _, _, data = cli("recipe", "list", "--dir", str(RECIPES), "--json")
    names = {r["name"] for r in data["recipes"]}
    assert {"demo", "int4-w4a16-gptq-g64", "bnb-nf4"} <= names
    assert all(r["description"] for r in data["recipes"])


def test_models_list_empty_home(cli):
    code, _, _, data = cli("models", "list", "--json")
    assert code == 0 and data["cached"] == [] and "demo" in data["named"]


def test_models_path_not_pulled(cli):
    code, _, err, _ = cli("models", "path", "demo")
    assert code == 2 and "quantkit models pull demo" in err


def test_debug_shows_traceback(tmp_path):
    import pytest
    from click.testing import CliRunner

    from quantkit.cli import cli as group
    from quantkit.errors import RecipeError

    bad = tmp_path / "bad.yaml"
    bad.write_text("nonsense: 1\n")
    with pytest.raises(RecipeError):
        CliRunner().invoke(group, ["--debug", "recipe", "validate", str(bad)], catch_exceptions=False)


def test_library_fault_is_one_line_exit_1(cli, tmp_path, monkeypatch):
    """An exception that is not a user error (a fault inside a library) is one line and exit 1;
    --debug shows the traceback."""
    import pytest
    from click.testing import CliRunner

    import quantkit.recipe.files
    from quantkit.cli import cli as group

    def boom(*_a, **_k):
        raise RuntimeError("The size of tensor a (128) must match the size of tensor b (2)\nsecond line")

    monkeypatch.setattr(quantkit.recipe.files, "load_recipe", boom)
    code, out, err, _ = cli("recipe", "validate", str(tmp_path / "r.yaml"))
    assert code == 1 and "Traceback" not in err and "second line" not in err
    assert "error: RuntimeError: The size of tensor a (128) must match" in err and "--debug" in err
    with pytest.raises(RuntimeError):
        CliRunner().invoke(group, ["--debug", "recipe", "validate", str(tmp_path / "r.yaml")], catch_exceptions=False)


# Every command and subcommand, written out: one added, renamed or dropped shows here.
COMMANDS = {
    "models": ["list", "path", "pull"],
    "recipe": ["list", "show", "validate"],
    "convert": [],
    "eval": [],
    "bench": [],
    "roofline": [],
    "run": [],
    "pareto": [],
    "compare": [],
    "publish": [],
    "load": [],
    "levers": [],
    "export": [],
    "sensitivity": [],
    "engines": ["install", "status"],
}


def test_every_command_exists(cli):
    import click

    from quantkit.cli import cli as group

    found = {name: sorted(cmd.commands) if isinstance(cmd, click.Group) else [] for name, cmd in group.commands.items()}
    assert found == COMMANDS
    for name, subcommands in COMMANDS.items():
        for words in [[name], *([name, sub] for sub in subcommands)]:
            code, out, err, _ = cli(*words, "--help")
            usage = out.splitlines()[0] if out else ""
            assert code == 0 and usage.startswith("Usage: ") and f" {' '.join(words)} " in usage, (words, err)


def test_a_closed_pipe_is_not_an_error():
    """`quantkit recipe list | head -1`: the reader leaves early; quantkit stops without an error line."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader is gone before quantkit writes a byte
    proc = subprocess.run(
        [sys.executable, "-m", "quantkit", "recipe", "list"], stdout=w, stderr=subprocess.PIPE, text=True
    )
    os.close(w)
    assert proc.returncode == 141 and proc.stderr == ""
