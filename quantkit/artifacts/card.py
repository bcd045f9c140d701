"""Model cards: Hugging Face metadata, how to load, provenance, and a results table that eval,
bench and run fill in (kept in quantkit.json["results"] and rendered between markers)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from quantkit.artifacts.card_views import BenchFigures, CalibrationFigures, MixedPrecisionFigures
from quantkit.artifacts.staging import read_meta
from quantkit.core.atomic import exclusive, write_json, write_text
from quantkit.core.eval_results import KL_EXACT, EvalResult
from quantkit.core.integrity import record
from quantkit.errors import QuantkitError
from quantkit.external import vllm_support

START, END = "<!-- quantkit:results:start -->", "<!-- quantkit:results:end -->"
# A Hub model id, ORG/NAME (huggingface_hub's validate_repo_id rules, with the namespace required).
_HUB_ID = re.compile(r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?/[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?")


def hub_id(name) -> str | None:
    """`name` when it is a Hub model id; None for a local path (never published in a card)."""
    if (
        not isinstance(name, str)
        or not _HUB_ID.fullmatch(name)
        or "--" in name
        or ".." in name
        or name.endswith(".git")
    ):
        return None
    return name


def _source_label(meta: dict) -> str:
    """The base model's Hub id, else only the source directory's name (a card never shows a local path)."""
    return (
        hub_id(meta.get("base_model"))
        or Path(str((meta.get("source") or {}).get("path") or "the source checkpoint")).name
    )


def _front_matter(meta: dict) -> str:
    q = meta.get("quantization") or {}
    tags = ["quantkit", q.get("format", ""), q.get("method", ""), q.get("scheme", "")]
    if meta.get("gqa"):
        tags.append("gqa")
    fm = {"base_model": hub_id(meta.get("base_model"))} if hub_id(meta.get("base_model")) else {}
    fm |= {
        "base_model_relation": "quantized" if q else "finetune",
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": [t for t in tags if t],
    }
    return "---\n" + yaml.safe_dump(fm, sort_keys=False) + "---\n"


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def results_table(results: dict) -> str:
    rows = ["| metric | value |", "| --- | --- |"]
    ev = EvalResult.from_json(results["eval"], "quantkit.json results.eval") if results.get("eval") else None
    texts = ev.texts if ev is not None else ()  # one block per evaluation domain
    for t in texts:
        w, dom = t.windows, f"{t.label}: " if len(texts) > 1 else ""
        kind = "exact" if t.kl_kind == KL_EXACT else t.kl_kind.replace("topk-", "top-")
        rows += [
            f"| {dom}perplexity ({w.count} x {w.seq_len} tokens of {w.get('source', '?')}, "
            f"{w.get('region', '')}) | {_fmt(t.ppl, '.3f')} (baseline {_fmt(t.baseline_ppl, '.3f')}) |",
            f"| {dom}dPPL | {_fmt(t.delta_ppl_pct, '+.2f')}% |",
            f"| {dom}KL divergence vs baseline, {kind} (mean / p99) | "
            f"{_fmt(t.kld.mean, '.4f')} / {_fmt(t.kld.p99, '.3f')} |",
            f"| {dom}top-1 agreement | {_fmt(t.top1_agreement * 100, '.2f')}% |",
        ]
    for name, t in (ev.tasks if ev is not None else {}).items():
        rows.append(
            f"| {name} {t.metric} | {t.value:.4f} (baseline {t.baseline:.4f}, delta "
            f"{t.delta:+.4f} +- {t.delta_stderr:.4f}) |"
        )
    if results.get("bench"):
        b = BenchFigures.from_json(results["bench"])
        rows += [
            f"| TTFT ({b.prompt_len}-token prompt, {b.device}, {b.engine}) | {_fmt(b.ttft_ms, '.1f')} ms |",
            f"| TPOT (batch 1) | {_fmt(b.tpot_ms, '.2f')} ms (roofline {_fmt(b.predicted_tpot_ms, '.2f')} ms) |",
            f"| bytes read per token | {_fmt((b.bytes_per_token or 0) / 1e6, '.1f')} MB |",
            f"| kernel | {b.kernel or 'n/a'} |",
        ]
    if len(rows) == 2:
        return (
            "No results yet: `quantkit eval ARTIFACT --baseline BASE --text SPEC "
            "--update-card` and `quantkit bench` fill this table."
        )
    return "\n".join(rows)


def _body(meta: dict) -> str:
    q = meta.get("quantization") or {}
    name = meta.get("name", "artifact")
    calib = meta.get("calibration") or {}
    lines = [f"# {name}", ""]
    if q:
        lines += [
            f"Quantized with quantkit from `{_source_label(meta)}`: "
            f"**{q.get('method')}**, {q.get('scheme', '')}, format `{q.get('format')}`.",
            "",
        ]
    if meta.get("gqa"):
        g = meta["gqa"]
        lines += [
            f"KV heads reduced {g.get('kv_heads_before')} -> {g.get('kv_heads_after')} "
            f"({g.get('merge')} merge, {g.get('grouping')} grouping).",
            "",
        ]
    if meta.get("mixed_precision"):
        lines += mixed_precision_table(meta["mixed_precision"]) + [""]
    lines += [
        "## How to load",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")',
        'tok = AutoTokenizer.from_pretrained("PATH_OR_REPO")',
        "```",
        "",
    ]
    lines += vllm_support.card_lines(meta) + [""]  # per device: measured on the CPU, read from vLLM's kernels for GPUs
    lines += ["## Provenance", "", f"- source checkpoint sha256: `{meta.get('source', {}).get('sha256', 'n/a')}`"]
    if calib:
        c = CalibrationFigures.from_json(calib)
        lines.append(
            f"- calibration: {c.text} ({c.samples} x {c.seq_len} tokens, seed {c.seed}, "
            f"duplicate windows {(c.duplicate_fraction or 0) * 100:.1f}%)"
        )
        if c.domains is not None:  # a calibration mix (data/mix.py): samples per domain
            left = c.left_out_names()
            lines.append(
                "  - samples per domain: "
                + ", ".join(f"{d} {n}" for d, n in c.domains.items())
                + (f" (left out, absent here: {', '.join(left)})" if left else "")
            )
    lines += [
        f"- verification: {meta.get('verification', {}).get('status', 'n/a')}",
        "- recipe, tool versions and every file's sha256: `quantkit.json`",
        "",
    ]
    lines += ["## Results", "", START, results_table(meta.get("results") or {}), END, ""]
    return "\n".join(lines)


def _text_label(source) -> str:
    """A text SPEC as a card shows it: a file by its name alone (a card never shows a local path)."""
    source = str(source or "?")
    return f"file:{Path(source[5:]).name}" if source.startswith("file:") else source


def mixed_precision_table(record: dict) -> list[str]:
    """How many units took each scheme and in which layers (quantkit.json's `mixed_precision`)."""
    mp = MixedPrecisionFigures.from_json(record)
    lines = [
        "## Mixed precision",
        "",
        f"Chosen on this model: {mp.raised} of {len(mp.ranking)} "
        f"units raised above {mp.base} within "
        f"{mp.budget_bits} bits/weight ({_fmt(mp.bits_per_weight, '.4f')} stored), by "
        "the KL each unit's rounding alone costs on "
        f"{mp.windows_used} x {mp.windows_seq_len} tokens of {_text_label(mp.text_source)}. "
        "Per-unit figures: `quantkit.json` (`mixed_precision`).",
        "",
        "| scheme | units | layers |",
        "| --- | --- | --- |",
    ]
    for scheme in [mp.base, *mp.choices]:
        took = [u for u in mp.ranking if u.chosen == scheme]
        where = (
            "; ".join(
                f"{unit}: {', '.join(str(u.layer) for u in sorted(took, key=lambda u: u.layer) if u.unit == unit)}"
                for unit in dict.fromkeys(u.unit for u in took)
            )
            if scheme != mp.base
            else "the others"
        )
        lines.append(f"| {scheme}{' (base)' if scheme == mp.base else ''} | {len(took)} | {where or '-'} |")
    return lines


def render_card(meta: dict) -> str:
    return _front_matter(meta) + "\n" + _body(meta)


def write_card(artifact: Path, meta: dict) -> None:
    write_text(artifact / "README.md", render_card(meta))


def is_artifact(path) -> bool:
    return isinstance(path, Path) and (path / "quantkit.json").is_file()


def check_card_updatable(artifact: Path) -> None:
    """Called before the work whose figures the card is to hold, so the figures are not lost."""
    if not is_artifact(artifact):
        raise QuantkitError(f"{artifact}: not a quantkit artifact (no quantkit.json); its model card cannot be updated")


def update_card_results(artifact: Path, results: dict) -> dict:
    """Merge figures into quantkit.json["results"] and re-render the card's results table.

    Under the artifact's lock (no lost update when two commands fill the card at once, no write
    into an artifact a convert is replacing); both files are written with write-then-rename and
    the card's new sha256 goes into the integrity manifest."""

    check_card_updatable(artifact)
    with exclusive(artifact, what=str(artifact)):
        meta = read_meta(artifact)
        merged = {**(meta.get("results") or {}), **results}
        meta["results"] = merged
        write_card_table(artifact, meta, merged)
        record(artifact, meta, "README.md")
        write_json(artifact / "quantkit.json", meta, default=str)
    return meta


def write_card_table(artifact: Path, meta: dict, merged: dict) -> None:
    card = artifact / "README.md"
    try:
        text = card.read_text() if card.is_file() else render_card(meta)
    except (OSError, UnicodeDecodeError):  # a damaged card is rendered anew
        text = render_card(meta)
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        text = head + START + "\n" + results_table(merged) + "\n" + END + tail
    else:
        text = render_card(meta)
    write_text(card, text)
