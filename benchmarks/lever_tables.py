"""Tables of a finished lever study (`quantkit levers ... --out DIR`, its study.json), for the result
files of levers.py: one table per study, the columns its lever acts on.

Every interval is a 95% bootstrap interval (quantkit/load/intervals.py); "moved" only when it
excludes no change. A table carries its own command, machine and date (`source`), so that a result
file can hold studies measured by separate runs of its script.
"""

from __future__ import annotations

from pathlib import Path

STUDY_KINDS = ("agent", "long-short", "admission", "copy")


def _col(key: str, header: str, fmt: str = "{}") -> dict:
    return {"key": key, "header": header, "fmt": fmt}


def _ci(pair, digits: int = 2) -> str | None:
    if not pair:
        return None
    low, high = ("…" if v is None else f"{v:.{digits}f}" for v in pair)
    return f"[{low}, {high}]"


def _knee(row: dict) -> str:
    if row.get("slo_knee_censored"):
        return f"{'<' if row['slo_knee_censored'] == 'below' else '>'} {row['slo_knee_bound']:g}"
    if row.get("slo_knee") is None:
        return "—"
    return f"{row['slo_knee']:.2f} {_ci(row['slo_knee_ci95'])}"


def _shift(row: dict) -> str:
    found = row.get("slo_knee_shift")
    if not found:
        return "—"
    if not found.get("ci95"):
        return f"— ({found.get('why')})"
    word = "moved" if found["moved"] else "not moved"
    return f"×{found['ratio']:.2f} {_ci(found['ci95'])} {word}"


def _levels(study: dict, index: int) -> dict[float, dict]:
    run = study["runs"][index]
    return {s["offered"]: s for s in run.get("levels") or run["steps"] if not s.get("partial")}


def _matched(study: dict, index: int) -> dict[float, dict]:
    """This lever's entries of the comparison at each level both it and the baseline measured."""
    out = {}
    for level in (study.get("comparison") or {}).get("matched_levels") or []:
        out[level["offered"]] = level["runs"][index]
    return out


def _diff(entry: dict | None) -> str | None:
    if not entry or entry.get("difference_ms") is None:
        return None
    low, high = entry["ci95"]
    return f"{entry['difference_ms']:+.0f} [{low:+.0f}, {high:+.0f}]{' moved' if entry['moved'] else ''}"


def _pct(value) -> str | None:
    return None if value is None else f"{100 * value:.0f}%"


def knee_table(study: dict) -> dict:
    """agent and long-short: the SLO knee per lever with its interval and its move against the baseline."""
    slo = study["runs"][0]["analysis"].get("slo_knee") or {}
    cls = (slo.get("slo") or {}).get("class")
    rows = []
    for i, row in enumerate(study["table"]):
        levels = _levels(study, i)
        first = min(levels)
        parts = (levels[first].get("ttft_parts") or {}) if levels else {}
        rows.append(
            {
                "lever": row["lever"],
                "changes": row["changes"],
                "knee": _knee(row),
                "knee_qps": row.get("slo_knee_qps"),
                "shift": _shift(row) if i else "baseline",
                "ttft_p50": (levels[first]["ttft_ms"] or {}).get("p50") if levels else None,
                "prefill": (parts.get("prefill_ms") or {}).get("mean"),
                "queue_shares": f"{_pct(row.get('first_queue_share'))} → {_pct(row.get('last_queue_share'))}",
                "cached": _pct(row.get("first_cache_hit")),
                "cause": row.get("cause"),
                "class_p99": "; ".join(
                    f"{lv}: {v:.0f}" for lv, v in ((row.get("class_ttft_p99_ms") or {}).get(cls) or {}).items()
                )
                if cls
                else None,
                "answered": "/".join(str(n) for n in row["requests_per_level"]),
                "client_cpu": row.get("client_cpu_max"),
            }
        )
    cols = [
        _col("lever", "lever", "`{}`"),
        _col("changes", "changes"),
        _col("knee", f"SLO knee{' (' + cls + ' prompts)' if cls else ''}, concurrency [95%]"),
        _col("knee_qps", "req/s at the knee", "{:.2f}"),
        _col("shift", "knee vs baseline [95%]"),
        _col("ttft_p50", "TTFT-P50 at 1 ms", "{:.0f}"),
        _col("prefill", "prefill at 1 ms (server)", "{:.0f}"),
        _col("queue_shares", "queue share of TTFT, lightest → heaviest level"),
        _col("cached", "prompt cached at 1"),
        _col("cause", "degraded first: cause"),
    ]
    if cls:
        cols.append(_col("class_p99", f"{cls} TTFT-P99 ms per level"))
    cols += [_col("answered", "requests per level"), _col("client_cpu", "client CPU (cores, max)", "{:.2f}")]
    return {"columns": cols, "rows": rows, "slo": slo.get("slo")}


def matched_table(study: dict, metric: str = "ttft") -> dict:
    """admission and copy: per level, each lever's P99 against the baseline's, with the interval of
    the difference; TPOT-P50, drafts accepted, rejected requests and goodput beside it."""
    rows = []
    for i, row in enumerate(study["table"]):
        levels, matched = _levels(study, i), _matched(study, i)
        for level, step in sorted(levels.items()):
            entry = matched.get(level) or {}
            sent = step["requests"]
            rows.append(
                {
                    "lever": row["lever"],
                    "level": level,
                    "answered": f"{step['completed']}/{sent}",
                    "ttft_p99": step["ttft_ms"]["p99"],
                    "ttft_diff": _diff(entry.get("ttft_p99_vs_base")) if i else "baseline",
                    "tpot_p50": step["tpot_ms"]["p50"],
                    "tpot_p99": step["tpot_ms"]["p99"],
                    "tpot_diff": _diff(entry.get("tpot_p99_vs_base")) if i else "baseline",
                    "accepted": _pct(step.get("draft_acceptance")),
                    "rejected": _pct(step["errors"].get("rejected", 0) / sent if sent else None),
                    "goodput": (step.get("goodput") or {}).get("qps"),
                    "client_cpu": (step.get("cpu") or {}).get("client"),
                }
            )
    mode = study["runs"][0]["config"]["mode"]
    cols = [
        _col("lever", "lever", "`{}`"),
        _col("level", "concurrency" if mode == "concurrency" else "req/s offered", "{:g}"),
        _col("answered", "answered/sent"),
    ]
    if metric == "ttft":
        cols += [
            _col("ttft_p99", "TTFT-P99 ms (admitted)", "{:.0f}"),
            _col("ttft_diff", "vs baseline ms [95%]"),
            _col("rejected", "rejected"),
            _col("goodput", "goodput req/s", "{:.2f}"),
        ]
    else:
        cols += [
            _col("tpot_p50", "TPOT-P50 ms", "{:.1f}"),
            _col("tpot_p99", "TPOT-P99 ms", "{:.1f}"),
            _col("tpot_diff", "TPOT-P99 vs baseline ms [95%]"),
            _col("accepted", "drafts accepted"),
        ]
    cols.append(_col("client_cpu", "client CPU (cores)", "{:.2f}"))
    return {"columns": cols, "rows": rows}


def study_table(kind: str, study: dict) -> dict:
    if kind in ("agent", "long-short"):
        return knee_table(study)
    return matched_table(study, "ttft" if kind == "admission" else "tpot")


def summary(study: dict, repo: Path) -> dict:
    """study.json without its runs' per-request samples (each run stays in its directory), naming no
    path of this machine."""
    out = {k: v for k, v in study.items() if k != "runs"}
    source = Path(out.get("source", ""))
    out["source"] = str(source.relative_to(repo)) if source.is_relative_to(repo) else source.name
    if out.get("prefix_reference"):
        out["prefix_reference"] = {**out["prefix_reference"], "shape": "demo (quantkit models path demo)"}
    return out
