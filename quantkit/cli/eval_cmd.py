"""`quantkit eval`: accuracy deltas of a model against its baseline, one row per text domain."""

from __future__ import annotations

import click

from quantkit.cli._common import MODEL, echo_json, json_option
from quantkit.cli._options import settings_from_cli, settings_options
from quantkit.core.eval_results import EvalResult, TextResult
from quantkit.evals.eval_settings import EvalSettings
from quantkit.evals.scorers import scorer_named

# Options of the command that are not evaluation settings: the two models (run_eval's arguments)
# and what is done with the result. Every other option is a field of EvalSettings.
NOT_SETTINGS = ("model", "baseline", "update_card", "plan_only", "as_json")

SPLIT_USE = {
    "selection": "the first half of each text's region, where recipes, methods and layers are chosen",
    "confirmation": "the second half of each text's region, which no choice saw: the figures to report",
}


def _ci(pair, fmt: str) -> str:
    return f"[{format(pair[0], fmt)}, {format(pair[1], fmt)}]"


def domain_table(texts: tuple[TextResult, ...]) -> list[str]:
    """One row per text: PPL, its baseline's, ΔPPL and mean KL with their 95% bootstrap CIs, KL p99, top-1."""
    head = (
        f"{'domain':<20} {'windows':>9} {'PPL':>9} {'base PPL':>9} {'ΔPPL %  [95% CI]':>26} "
        f"{'KL mean  [95% CI]':>30} {'KL p99':>7} {'top-1':>7}"
    )
    lines = [head]
    for t in texts:
        w, k, ci = t.windows, t.kld, t.ci95
        lines.append(
            f"{t.label[:20]:<20} {w.count:>4}x{w.seq_len:<4} {t.ppl:>9.4f} {t.baseline_ppl:>9.4f} "
            f"{t.delta_ppl_pct:>+8.2f} {_ci(ci.delta_ppl_pct, '+.2f'):>17} "
            f"{k.mean:>8.5f} {_ci(ci.kld_mean, '.5f'):>21} {k.p99:>7.3f} {t.top1_agreement * 100:>6.2f}%"
        )
    return lines


def position_table(t: TextResult) -> list[str]:
    """A text's figures by position within the window (a KV cache grows along it), one row per bucket."""
    lines = [
        f"  {t.label} by position in the window (whole windows resampled):",
        f"  {'positions':>11} {'tokens':>8} {'ΔPPL %  [95% CI]':>26} {'KL mean  [95% CI]':>30} {'top-1':>7}",
    ]
    for b in t.positions:
        lines.append(
            f"  {b.label:>11} {b.tokens:>8} {b.delta_ppl_pct:>+8.2f} {_ci(b.ci95.delta_ppl_pct, '+.2f'):>17} "
            f"{b.kld.mean:>8.5f} {_ci(b.ci95.kld_mean, '.5f'):>21} {b.top1_agreement * 100:>6.2f}%"
        )
    return lines


def render(result: EvalResult) -> str:
    scorer = result.scorer or {}
    batch = f", {scorer['batch_size']} window(s) per forward pass" if scorer.get("batch_size") else ""
    lines = [
        f"model     {result.model}",
        f"baseline  {result.baseline}{_baseline_note(result.baseline_check)}",
        f"device    {result.device_label}, {result.dtype}{batch}",
    ]
    if result.engine != result.baseline_engine:  # the model under test scored by another library than the baseline
        threads = f", {scorer['threads']} threads" if scorer.get("threads") else ""
        lines.append(
            f"scorer    {scorer.get('kernel', result.engine)}{threads} (the "
            f"baseline: {result.baseline_engine} on the device above)"
        )
    if result.split != "all":
        lines.append(f"split     {result.split}: {SPLIT_USE[result.split]}")
    if result.kl_kind:
        lines.append(f"KL        {kl_words(result.kl_kind)}")
    if result.texts:
        lines += ["", *domain_table(result.texts), ""]
        lines += [f"  {t.label}: {t.text} ({_part(t.windows)}), {t.tokens} scored tokens" for t in result.texts]
        for t in result.texts:
            if len(t.positions) > 1:
                lines += ["", *position_table(t)]
    for name, t in result.tasks.items():
        lines.append(
            f"task {name:<14} {t.metric} {t.value:.4f} (baseline {t.baseline:.4f})  delta "
            f"{t.delta:+.4f} +- {t.delta_stderr:.4f}"
        )
    return "\n".join(lines)


def kl_words(kind: str) -> str:
    """The KL's kind in words, for a table's header line."""
    if kind == "exact":
        return "KL(baseline || model) over the whole vocabulary (exact)"
    return f"KL(baseline || model), {kind}: the baseline's top tokens plus one tail bucket"


def _part(windows) -> str:
    """The region scored, with its part and token range when a split was asked for."""
    region, split, span = windows.region, windows.split, windows.token_range
    if split == "all" or not span:
        return region
    return f"{region}, {split}: tokens {span[0]:,} to {span[1]:,}"


def _baseline_note(check: dict) -> str:
    if check.get("match") is None:
        return ""
    return "  (the artifact's source)" if check["match"] else "  (NOT the artifact's source: --baseline-mismatch-ok)"


def _model_path(model: str, engine: str):
    """A model argument -> a checkpoint or artifact directory; also a GGUF file for a scorer that
    takes them (checked as a GGUF later, in one line)."""
    from quantkit.models.resolve import resolve_path

    return resolve_path(model, gguf=scorer_named(engine).takes_gguf)  # an unknown engine: one line


@click.command("eval")
@click.argument("model", type=MODEL)
@click.option(
    "--baseline", "baseline", required=True, type=MODEL, help="The original model (directory, hub id or 'demo')."
)
@settings_options(EvalSettings)  # every option of the evaluation: recipe/eval_options.py
@click.option("--update-card", is_flag=True, help="Write the figures into the artifact's model card.")
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Print the evaluation's memory and time from the headers, then exit without loading weights.",
)
@json_option
def eval_cmd(model, baseline, update_card, plan_only, as_json, **options):
    """Perplexity, KL divergence, top-1 agreement (one row per text domain, and by position within
    the window) and lm-eval deltas of MODEL against --baseline."""
    from dataclasses import replace

    from quantkit.device import resolve_device
    from quantkit.evals.domains import default_texts
    from quantkit.evals.eval_runner import run_eval
    from quantkit.models.resolve import resolve_path

    settings = settings_from_cli(EvalSettings, options)  # every option checked here, before anything is read
    if not settings.texts and not settings.tasks:
        settings = replace(settings, texts=tuple(default_texts()))
    resolve_device(settings.device)  # an unavailable device: one line, before anything loads
    model_path, base_path = _model_path(model, settings.engine), resolve_path(baseline)
    if update_card:
        from quantkit.artifacts.card import check_card_updatable

        check_card_updatable(model_path)
    if plan_only:  # the evaluation's own checks (evals.runner.prepare_eval), then its cost
        from quantkit.cli._costs import show
        from quantkit.costs.commands import plan_eval

        return show(plan_eval(model_path, base_path, settings), as_json)
    from quantkit.core.distributed import session

    with session(settings.device) as runtime:  # under torchrun: each rank its share of the windows, on its device
        result = run_eval(model_path, base_path, settings, runtime)
    if not runtime.writer:
        return  # a rank other than 0: rank 0 reports
    if update_card:
        from quantkit.artifacts.card import update_card_results

        update_card_results(model_path, {"eval": result.to_json()})
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(render(result))


COMMANDS = [eval_cmd]
