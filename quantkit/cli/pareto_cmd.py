"""`quantkit pareto MODEL --calib SPEC --out DIR`: quantkit's points and llama.cpp's K-quants at
several sizes, scored by the same KL harness, as a curve of accuracy per bit."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, debug_enabled, echo_json, json_option
from quantkit.errors import QuantkitError
from quantkit.pipeline.front import DEFAULT_ANCHORS, DEFAULT_CT_RECIPE, DEFAULT_SIZES, DEFAULT_TEXTS, LINES, SIZE_RANGE

SIZES = ",".join(f"{s:g}" for s in DEFAULT_SIZES)
LINE_NAMES = ",".join(LINES)


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise QuantkitError(f"{option} {text!r}: expected comma-separated bits/weight, e.g. {SIZES}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))


@click.command("pareto")
@click.argument("model", type=MODEL)
@click.option(
    "--calib", default="mix:default", show_default=True, metavar="SPEC", help="Calibration text of every choice."
)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory of the front.")
@click.option(
    "--sizes",
    default=SIZES,
    show_default=True,
    help=f"Bits/weight to compare at ({SIZE_RANGE[0]:g} to {SIZE_RANGE[1]:g}); compressed-tensors' budgets.",
)
@click.option(
    "--anchors",
    default=",".join(DEFAULT_ANCHORS),
    show_default=True,
    help="llama.cpp types (each also --mixed's size).",
)
@click.option(
    "--text",
    "texts",
    multiple=True,
    metavar="SPEC",
    help="Evaluation text, repeatable (default: " + ", ".join(DEFAULT_TEXTS) + ").",
)
@click.option(
    "--split",
    type=click.Choice(["confirmation", "selection", "all"]),
    default="confirmation",
    show_default=True,
    help="The held-out windows scored (confirmation: where no choice was made).",
)
@click.option("--calib-samples", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--calib-seq-len", type=click.IntRange(min=8), default=512, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=8), default=512, show_default=True, help="Tokens per eval window.")
@click.option("--max-tokens", type=click.IntRange(min=8), default=4096, show_default=True, help="Tokens per text.")
@click.option("--mixed-types", default=None, metavar="TYPES", help="--mixed's types (default: export's list).")
@click.option("--ct-recipe", default=DEFAULT_CT_RECIPE, show_default=True, help="The auto: recipe of the budgets.")
@click.option("--lines", "lines", default=LINE_NAMES, show_default=True, help="The lines of the front to make.")
@click.option("--rerun", is_flag=True, help="Make every point again instead of reusing finished ones.")
@click.option(
    "--plan", "plan_only", is_flag=True, help="Print the front's predicted time and memory, then exit (nothing made)."
)
@json_option
def pareto_cmd(
    model,
    calib,
    out,
    sizes,
    anchors,
    texts,
    split,
    calib_samples,
    calib_seq_len,
    seq_len,
    max_tokens,
    mixed_types,
    ct_recipe,
    lines,
    rerun,
    plan_only,
    as_json,
):
    """quantkit's points (GGUF --mixed at each anchor's size, compressed-tensors auto at each size) and
    llama.cpp's K-quants with an importance matrix, KL per bit on several domains."""
    from quantkit.core.atomic import sigterm_as_interrupt
    from quantkit.models.resolve import resolve_path
    from quantkit.pipeline.pareto import ParetoSettings, check_out, run_pareto

    resolve_path(model)  # a name, a path or an artifact, as every command takes it: checked here (one line, exit 2)
    s = ParetoSettings(
        model=model,  # as the user spelled it: the front's title and record name no directory of this machine
        out=out,
        calib=calib,
        sizes=_floats(sizes, "--sizes"),
        anchors=tuple(a.upper() for a in _names(anchors)),
        texts=tuple(texts) or DEFAULT_TEXTS,
        split=split,
        calib_samples=calib_samples,
        calib_seq_len=calib_seq_len,
        seq_len=seq_len,
        max_tokens=max_tokens,
        mixed_types=tuple(t.upper() for t in _names(mixed_types)) if mixed_types else None,
        ct_recipe=ct_recipe,
        lines=_names(lines),
        rerun=rerun,
        debug=debug_enabled(),
    )
    check_out(s)  # a directory of its own, before the plan or any work
    if plan_only:
        from quantkit.cli._costs import show
        from quantkit.pipeline.pareto_costs import plan_pareto

        return show(plan_pareto(s), as_json)
    with sigterm_as_interrupt():
        result = run_pareto(s)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo((out / "pareto.md").read_text())
    click.echo(f"front: {out / 'pareto.json'}, {out / 'pareto.md'}, {out / 'pareto.png'}")


COMMANDS = [pareto_cmd]
