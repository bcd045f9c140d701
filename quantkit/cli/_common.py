"""Shared CLI plumbing: the --json flag, printing results, the rich console."""

from __future__ import annotations

from typing import Any

import click

from quantkit.core.atomic import strict_json

json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a recipe key, validated like the file (repeatable), e.g. steps[0].gqa.kv_heads=2.",
)


class ModelArg(click.ParamType):
    """A model argument (MODEL, --model, --baseline, ARTIFACT): every command resolves it with
    models/resolve.py, so each takes the same forms (a named model such as demo, a checkpoint or
    artifact directory, a hub id; a GGUF file where it runs them). The value stays the text the user
    gave: a command resolves it after its own cheaper checks (`tests/test_cli_models.py` walks them)."""

    name = "model"

    def get_metavar(self, param, ctx=None) -> str:
        return "MODEL"


MODEL = ModelArg()


def echo_json(data: Any) -> None:
    click.echo(strict_json(data, indent=2))


def console(stderr: bool = True):
    from rich.console import Console

    return Console(stderr=stderr)


def debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    return bool(root and root.obj and root.obj.get("debug"))


def int_list(text: str | None, option: str) -> tuple[int, ...]:
    """`16,8,4` -> (16, 8, 4); None (the option not given) -> (); anything else, an empty text or
    an empty item (`0,,4`) included, is a one-line error naming the option."""
    from quantkit.errors import QuantkitError

    if text is None:
        return ()
    items = [x.strip() for x in text.split(",")]
    try:
        if not all(items):
            raise ValueError
        return tuple(int(x) for x in items)
    except ValueError:
        raise QuantkitError(f"{option} {text!r}: expected comma-separated integers, e.g. 16,8,4") from None
