"""Model cards: Hugging Face metadata, how to load, provenance, and a results table that eval,
bench and run fill in (kept in quantkit.json["results"] and rendered between markers)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .errors import QuantkitError

START, END = "<!-- quantkit:results:start -->", "<!-- quantkit:results:end -->"


def _front_matter(meta: dict) -> str:
    q = meta.get("quantization") or {}
    tags = ["quantkit", q.get("format", ""), q.get("method", ""), q.get("scheme", "")]
    if meta.get("gqa"):
        tags.append("gqa")
    fm = {
        "base_model": meta.get("base_model") or meta.get("source", {}).get("path", ""),
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
    ev = results.get("eval") or {}
    if "ppl" in ev:
        w = ev.get("windows", {})
        rows += [
            f"| perplexity ({w.get('count')} x {w.get('seq_len')} tokens of {w.get('source', '?')}, {w.get('region', '')}) | {_fmt(ev['ppl'], '.3f')} (baseline {_fmt(ev['baseline_ppl'], '.3f')}) |",
            f"| dPPL | {_fmt(ev['delta_ppl_pct'], '+.2f')}% |",
            f"| KL divergence vs baseline (mean / p99) | {_fmt(ev['kld']['mean'], '.4f')} / {_fmt(ev['kld']['p99'], '.3f')} |",
            f"| top-1 agreement | {_fmt(ev['top1_agreement'] * 100, '.2f')}% |",
        ]
    for name, t in (ev.get("tasks") or {}).items():
        rows.append(f"| {name} {t['metric']} | {t['value']:.4f} (baseline {t['baseline']:.4f}, delta {t['delta']:+.4f} +- {t['delta_stderr']:.4f}) |")
    b = results.get("bench") or {}
    if b:
        rows += [
            f"| TTFT ({b.get('prompt_len')}-token prompt, {b.get('device')}, {b.get('engine')}) | {_fmt(b.get('ttft_ms'), '.1f')} ms |",
            f"| TPOT (batch 1) | {_fmt(b.get('tpot_ms'), '.2f')} ms (roofline {_fmt(b.get('predicted_tpot_ms'), '.2f')} ms) |",
            f"| bytes read per token | {_fmt((b.get('bytes_per_token') or 0) / 1e6, '.1f')} MB |",
            f"| kernel | {b.get('kernel', 'n/a')} |",
        ]
    if len(rows) == 2:
        return "No results yet: `quantkit eval ARTIFACT --baseline BASE --text SPEC --update-card` and `quantkit bench` fill this table."
    return "\n".join(rows)


def _body(meta: dict) -> str:
    q = meta.get("quantization") or {}
    name = meta.get("name", "artifact")
    calib = meta.get("calibration") or {}
    lines = [f"# {name}", ""]
    if q:
        lines += [
            f"Quantized with quantkit from `{meta.get('base_model') or meta.get('source', {}).get('path')}`: "
            f"**{q.get('method')}**, {q.get('scheme', '')}, format `{q.get('format')}`.",
            "",
        ]
    if meta.get("gqa"):
        g = meta["gqa"]
        lines += [f"KV heads reduced {g.get('kv_heads_before')} -> {g.get('kv_heads_after')} ({g.get('merge')} merge, {g.get('grouping')} grouping).", ""]
    lines += ["## How to load", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              'model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")', 'tok = AutoTokenizer.from_pretrained("PATH_OR_REPO")', "```", ""]
    if q.get("format") == "compressed-tensors":
        lines += ["vLLM serves it unchanged: `vllm serve PATH_OR_REPO`.", ""]
    lines += ["## Provenance", "", f"- source checkpoint sha256: `{meta.get('source', {}).get('sha256', 'n/a')}`"]
    if calib:
        lines.append(f"- calibration: {calib.get('source')} ({calib.get('samples')} x {calib.get('seq_len')} tokens, seed {calib.get('seed')}, "
                     f"duplicate windows {calib.get('duplicate_fraction', 0) * 100:.1f}%)")
        if isinstance(calib.get("domains"), dict):  # a calibration mix (calib_mix.py): samples per domain
            left = [p.get("name") for p in calib.get("left_out") or [] if isinstance(p, dict)]
            lines.append("  - samples per domain: " + ", ".join(f"{d} {n}" for d, n in calib["domains"].items())
                         + (f" (left out, absent here: {', '.join(map(str, left))})" if left else ""))
    lines += [f"- verification: {meta.get('verification', {}).get('status', 'n/a')}", f"- recipe, tool versions and every file's sha256: `quantkit.json`", ""]
    lines += ["## Results", "", START, results_table(meta.get("results") or {}), END, ""]
    return "\n".join(lines)


def render_card(meta: dict) -> str:
    return _front_matter(meta) + "\n" + _body(meta)


def write_card(artifact: Path, meta: dict) -> None:
    (artifact / "README.md").write_text(render_card(meta))


def is_artifact(path) -> bool:
    return isinstance(path, Path) and (path / "quantkit.json").is_file()


def check_card_updatable(artifact: Path) -> None:
    """Called before the work whose figures the card is to hold, so the figures are not lost."""
    if not is_artifact(artifact):
        raise QuantkitError(f"{artifact}: not a quantkit artifact (no quantkit.json); its model card cannot be updated")


def update_card_results(artifact: Path, results: dict) -> dict:
    """Merge figures into quantkit.json["results"] and re-render the card's results table."""
    check_card_updatable(artifact)
    meta_file = artifact / "quantkit.json"
    meta = json.loads(meta_file.read_text())
    merged = {**(meta.get("results") or {}), **results}
    meta["results"] = merged
    tmp = meta_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(meta_file)
    card = artifact / "README.md"
    text = card.read_text() if card.is_file() else render_card(meta)
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        text = head + START + "\n" + results_table(merged) + "\n" + END + tail
    else:
        text = render_card(meta)
    card.write_text(text)
    return meta
