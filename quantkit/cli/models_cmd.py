"""`quantkit models pull|path|list`."""

from __future__ import annotations

import click

from quantkit.cli._common import console, echo_json, json_option


@click.group("models")
def models_group() -> None:
    """Named models (the demo model) and the local model cache."""


@models_group.command("pull")
@click.argument("name", default="demo")
@click.option("--force", is_flag=True, help="Rebuild even if cached.")
@json_option
def pull(name: str, force: bool, as_json: bool) -> None:
    """Build a named model into the cache (idempotent)."""
    from quantkit.errors import ModelError
    from quantkit.models.named_models import NAMED_MODELS, is_complete, named_model_dir, pull_named

    if name not in NAMED_MODELS:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(NAMED_MODELS)}")
    dest = named_model_dir(name)
    cached = is_complete(dest) and not force
    if not cached:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console()) as bar:
            task = bar.add_task(f"pulling {name}", total=None)
            pull_named(name, force=force, progress=lambda msg: bar.update(task, description=f"{name}: {msg}"))
    if as_json:
        echo_json({"name": name, "path": str(dest), "cached": cached})
    else:
        click.echo(str(dest))


@models_group.command("path")
@click.argument("name")
def path(name: str) -> None:
    """Print the local path of a named model (it must be pulled)."""
    from quantkit.models.resolve import resolve_path

    click.echo(str(resolve_path(name, pull=False)))


@models_group.command("list")
@json_option
def list_(as_json: bool) -> None:
    """Show the models in the cache."""
    from quantkit.models.named_models import NAMED_MODELS, list_cached

    cached = list_cached()
    if as_json:
        echo_json({"cached": cached, "named": sorted(NAMED_MODELS)})
        return
    if not cached:
        click.echo("no models cached; `quantkit models pull demo` builds the demo model")
    for m in cached:
        click.echo(f"{m['name']:<12} {m['bytes'] / 1e6:8.1f} MB  {m['path']}")


COMMANDS = [models_group]
