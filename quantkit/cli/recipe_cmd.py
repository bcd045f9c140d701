"""`quantkit recipe validate|list|show`."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import debug_enabled, echo_json, json_option, set_option

include_option = click.option(
    "--include-dir",
    "include_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Also allow `variants[i].recipe` includes from DIR (repeatable); by default an include must lie in the "
    "recipe's own directory tree (symlinks resolved).",
)


@click.group("recipe")
def recipe_group() -> None:
    """Validate and list recipes."""


@recipe_group.command("validate")
@click.argument("files", nargs=-1, required=True)
@set_option
@include_option
@json_option
def validate(files: tuple[str, ...], overrides: tuple[str, ...], include_dirs: tuple[str, ...], as_json: bool) -> None:
    """Validate recipe files; each error names the file and the key path. Exit 2 if any fails."""
    from quantkit.errors import QuantkitError
    from quantkit.recipe.files import load_recipe

    results, errors = [], []
    for f in files:
        try:
            recipe = load_recipe(f, overrides, include_dirs)
        except QuantkitError as exc:
            if debug_enabled():
                raise
            errors.append({"file": f, "error": str(exc)})
            continue
        results.append({"file": f, "name": recipe.name, "variants": [v.name for v in recipe.all_variants()]})
    if as_json:
        echo_json({"valid": results, "invalid": errors})
    else:
        for r in results:
            n = len(r["variants"])
            click.echo(f"ok  {r['file']}  ({n} variant{'s' if n != 1 else ''})")
        for e in errors:
            click.echo(f"error: {e['error']}", err=True)
    if errors:
        raise SystemExit(2)


@recipe_group.command("list")
@click.option(
    "--dir",
    "directory",
    default=None,
    type=click.Path(file_okay=False),
    help="List the recipes in DIR instead of the built-in ones.",
)
@click.option("--studies", is_flag=True, help="List the built-in lever studies (quantkit levers NAME) instead.")
@json_option
def list_(directory: str | None, studies: bool, as_json: bool) -> None:
    """Name and one-line description of each built-in recipe (a RECIPE argument takes the name), or of
    each recipe in --dir."""
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import load_raw
    from quantkit.resources import recipes_dir, studies_dir

    folder = Path(directory) if directory else studies_dir() if studies else recipes_dir()
    rows = []
    for path in sorted(folder.glob("*.y*ml")):
        try:
            data = load_raw(path)
        except RecipeError:
            data = {"name": path.stem, "description": "(invalid YAML)"}
        if not isinstance(data, dict):
            data = {"name": path.stem, "description": "(not a recipe)"}
        desc = str(data.get("description", "")).strip().splitlines()
        rows.append(
            {
                "name": data.get("name", path.stem),
                "file": str(path),
                "description": desc[0] if desc else "",
                "builtin": directory is None,
            }
        )
    if as_json:
        echo_json({"recipes": rows})
        return
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        click.echo(f"{r['name']:<{width}}  {r['description']}")


@recipe_group.command("show")
@click.argument("file")
@set_option
@include_option
def show(file: str, overrides: tuple[str, ...], include_dirs: tuple[str, ...]) -> None:
    """Print the recipe as resolved (defaults filled in, overrides applied) as JSON."""
    from quantkit.recipe.files import load_recipe

    echo_json(load_recipe(file, overrides, include_dirs).to_dict())


COMMANDS = [recipe_group]
