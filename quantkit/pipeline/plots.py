"""PNG plots (matplotlib, Agg): the rule check, TTFT against prompt length, TPOT against KV depth, the
accuracy/speed front."""

from __future__ import annotations

from pathlib import Path

from quantkit.bench.bench_records import BenchRow, axis
from quantkit.bench.rows import point_of
from quantkit.core.fits import RuleFit
from quantkit.core.outputs import save_png
from quantkit.pipeline.run_report import ReportRow


def pyplot():
    """matplotlib.pyplot on the Agg backend: files only, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def rule_check(
    rows: list[BenchRow],
    fit: RuleFit,
    bandwidth_gbps: float,
    out: Path,
    title: str = "",
    fits: dict[str, RuleFit] | None = None,
    bandwidths: dict[str, float] | None = None,
) -> Path:
    """TPOT against bytes read per token: the points, the rule check's model of each (x) and the roofline.
    With `fits` (engine -> fit), one series per engine: its points, its fit and the roofline of its
    own probe (`bandwidths`, engine -> GB/s)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r.bytes_per_token / 1e6 for r in rows]
    top = max(xs) * 1.1 if xs else 1
    grid = [0, top]
    series = fits or {None: fit}
    for i, (engine, f) in enumerate(series.items()):
        color = f"C{i}"
        mine = [r for r in rows if engine is None or r.engine == engine]
        px, py = [r.bytes_per_token / 1e6 for r in mine], [r.tpot_ms for r in mine]
        ax.scatter(px, py, zorder=3, color=color, label=engine)
        for r, x, y in zip(mine, px, py):
            ax.annotate(r.name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        bw = (bandwidths or {}).get(engine, bandwidth_gbps)
        if (
            engine is None or i == 0 or abs(bw - bandwidth_gbps) > 0.05 * bandwidth_gbps
        ):  # one roofline unless the probes differ
            ax.plot(
                grid,
                [g * 1e6 / (bw * 1e9) * 1e3 for g in grid],
                "--",
                color="gray" if engine is None else color,
                alpha=0.7,
                label=f"roofline{'' if engine is None else f' ({engine} probe)'}: bytes / {bw:.1f} GB/s",
            )
        model = [f.model_s(point_of(r)) for r in mine] if f else []
        if model and None not in model:
            ax.scatter(
                px,
                [m * 1e3 for m in model],
                marker="x",
                color=color,
                label=f"{'' if engine is None else engine + ' '}rule check (non-negative terms, R² {f.r2:.3f})",
            )
    ax.set_xlabel("bytes read per decode token (MB)")
    ax.set_ylabel(axis("tpot_ms"))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(
        title
        or ("TPOT against bytes per token (batch 1), per engine" if fits else "TPOT against bytes per token (batch 1)")
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out, dpi=120)
    plt.close(fig)
    return out


def ttft_sweep(rows: list[BenchRow], out: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        sw = r.prompt_sweep
        if not sw:
            continue
        ls = [p.prompt_len for p in sw]
        line = ax.plot(ls, [p.ttft_ms.median for p in sw], "o-", label=f"{r.name} measured")
        ax.plot(ls, [p.predicted_ttft_ms for p in sw], ":", color=line[0].get_color(), label=f"{r.name} roofline")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel(axis("ttft_ms"))
    ax.set_title("TTFT against prompt length (batch 1)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out, dpi=120)
    plt.close(fig)
    return out


def tpot_depth(rows: list[BenchRow], fit: RuleFit, out: Path) -> Path:
    """TPOT against the KV depth, a series per model (and flash-attention setting): measured (o, solid),
    the roofline's prediction (dotted) and the rule check's model of each point (dashed)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple, list[BenchRow]] = {}
    for r in rows:
        if r.depth is not None:
            series.setdefault((r.name, r.engine, r.flash_attn), []).append(r)
    engines = len({k[1] for k in series}) > 1
    for name, engine, fa in series:
        rs = sorted(series[(name, engine, fa)], key=lambda r: r.depth)
        label = (
            name + (f" ({engine})" if engines else "") + ("" if fa is None else f", flash attn {'on' if fa else 'off'}")
        )
        xs = [r.depth for r in rs]
        line = ax.plot(xs, [r.tpot_ms for r in rs], "o-", label=f"{label} measured")
        color = line[0].get_color()
        ax.plot(xs, [r.predicted_tpot_ms for r in rs], ":", color=color, label=f"{label} roofline")
        fitted = [fit.model_s(point_of(r)) for r in rs]
        if fitted and None not in fitted:
            ax.plot(xs, [f * 1e3 for f in fitted], "--", color=color, alpha=0.6, label=f"{label} rule-check fit")
    ax.set_xlabel("KV depth (tokens in the cache when decode starts)")
    ax.set_ylabel(axis("tpot_ms"))
    ax.set_ylim(bottom=0)
    ax.set_title("TPOT against KV depth (batch 1)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out, dpi=120)
    plt.close(fig)
    return out


def pareto(rows: list[ReportRow], out: Path, metric: str = "kld_mean") -> Path:
    """Accuracy loss against TPOT; the front is the set no other variant beats on both. `metric`:
    a ReportRow figure (kld_mean, delta_ppl_pct)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))

    def y(r: ReportRow):
        return getattr(r, metric)

    pts = [r for r in rows if y(r) is not None and r.tpot_ms is not None]
    front = [
        p
        for p in pts
        if not any(
            q.tpot_ms <= p.tpot_ms and y(q) <= y(p) and q is not p and (q.tpot_ms < p.tpot_ms or y(q) < y(p))
            for q in pts
        )
    ]
    ax.scatter([p.tpot_ms for p in pts], [y(p) for p in pts], zorder=3)
    for p in pts:
        ax.annotate(p.name, (p.tpot_ms, y(p)), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front.sort(key=lambda p: p.tpot_ms)
    ax.plot([p.tpot_ms for p in front], [y(p) for p in front], "-", alpha=0.5, label="Pareto front")
    ax.set_xlabel("TPOT (ms, batch 1)")
    ax.set_ylabel({"kld_mean": "mean KL divergence vs baseline", "delta_ppl_pct": "ΔPPL (%)"}.get(metric, metric))
    ax.set_title("Accuracy against decode speed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, out, dpi=120)
    plt.close(fig)
    return out
