"""`quantkit eval`: accuracy deltas of a model against its baseline."""

from __future__ import annotations

import click

from ._common import echo_json, json_option


def render(result: dict) -> str:
    lines = []
    if "ppl" in result:
        k, ci = result["kld"], result["ci95"]
        w = result["windows"]
        lines += [
            f"model     {result['model']}",
            f"baseline  {result['baseline']}{_baseline_note(result.get('baseline_check') or {})}",
            f"text      {w.get('source')}  {w['count']} windows x {w['seq_len']} tokens ({w.get('region', '')}), {result['tokens']} scored tokens",
            f"PPL       {result['ppl']:.4f}  (baseline {result['baseline_ppl']:.4f})",
            f"dPPL      {result['delta_ppl_pct']:+.2f}%  95% CI [{ci['delta_ppl_pct'][0]:+.2f}, {ci['delta_ppl_pct'][1]:+.2f}]",
            f"KL        mean {k['mean']:.5f} [{ci['kld_mean'][0]:.5f}, {ci['kld_mean'][1]:.5f}]  median {k['median']:.5f}  p99 {k['p99']:.4f}  max {k['max']:.3f}",
            f"top-1     {result['top1_agreement'] * 100:.2f}% agreement",
        ]
    for name, t in result.get("tasks", {}).items():
        lines.append(
            f"task {name:<14} {t['metric']} {t['value']:.4f} (baseline {t['baseline']:.4f})  delta {t['delta']:+.4f} +- {t['delta_stderr']:.4f}"
        )
    return "\n".join(lines)


def _baseline_note(check: dict) -> str:
    if check.get("match") is None:
        return ""
    return "  (the artifact's source)" if check["match"] else "  (NOT the artifact's source: --baseline-mismatch-ok)"


@click.command("eval")
@click.argument("model")
@click.option("--baseline", "baseline", required=True, help="The original model (directory, hub id or 'demo').")
@click.option("--text", "text", default=None, help="file:PATH | hf:DATASET[:CONFIG]:SPLIT | self")
@click.option("--seq-len", default=512, show_default=True, type=int)
@click.option("--max-tokens", default=8192, show_default=True, type=int, help="Tokens to score (whole windows).")
@click.option("--region", default="first-half", show_default=True, type=click.Choice(["first-half", "second-half", "all"]))
@click.option("--tasks", default="", help="Comma-separated lm-eval tasks (local ones from evals/, or standard names online).")
@click.option("--limit", default=None, type=int, help="Examples per lm-eval task.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--allow-overlap", is_flag=True, help="Allow evaluation windows that overlap text the artifact was fitted on "
              "(calibration, GQA recovery).")
@click.option("--baseline-mismatch-ok", is_flag=True, help="Compare with a --baseline other than the checkpoint the artifact "
              "was converted from (its quantkit.json source.sha256).")
@click.option("--trust-remote-code", is_flag=True, help="Allow model code from the checkpoints (off by default).")
@click.option("--update-card", is_flag=True, help="Write the figures into the artifact's model card.")
@click.option("--plan", "plan_only", is_flag=True, help="Print the evaluation's memory and time from the headers, then exit without loading weights.")
@json_option
def eval_cmd(model, baseline, text, seq_len, max_tokens, region, tasks, limit, dtype, allow_overlap, baseline_mismatch_ok,
             trust_remote_code, update_card, plan_only, as_json):
    """Perplexity, KL divergence, top-1 agreement and lm-eval deltas of MODEL against --baseline."""
    from ..errors import DataError
    from ..evals.runner import run_eval
    from ..models import resolve_model

    task_list = tuple(t.strip() for t in tasks.split(",") if t.strip())
    if not text and not task_list:
        raise DataError("nothing to evaluate: pass --text SPEC and/or --tasks LIST")
    if max_tokens < seq_len:
        raise DataError(f"--max-tokens {max_tokens} is less than one window of --seq-len {seq_len}")
    model_path, base_path = resolve_model(model), resolve_model(baseline)
    if plan_only:
        from ..planner import plan_eval, show

        return show(plan_eval(str(model_path), str(base_path), text=text, seq_len=seq_len, max_tokens=max_tokens, dtype=dtype), as_json)
    if update_card:
        from ..card import check_card_updatable

        check_card_updatable(model_path)
    result = run_eval(
        model_path, base_path, text, seq_len=seq_len, max_tokens=max_tokens, region=region,
        tasks=task_list, limit=limit, dtype=dtype, allow_overlap=allow_overlap, baseline_mismatch_ok=baseline_mismatch_ok,
        trust_remote_code=trust_remote_code,
    )
    if update_card:
        from ..card import update_card_results

        update_card_results(model_path, {"eval": result})
    if as_json:
        echo_json(result)
    else:
        click.echo(render(result))


COMMANDS = [eval_cmd]
