"""PNG of TTFT-P99 and TPOT-P99 against achieved QPS, one line per load run through its levels (a
level's repeats pooled), the saturation knee circled, the SLO as a dotted line and the SLO knee as a
dashed line in its 95% interval's band; with an SLO on one workload class (long-short's `short`) the
P99s drawn are that class's. Where the server split TTFT, its parts (mean queue, prefill, other)
stacked against the offered load.

Uses matplotlib's object API with the Agg canvas: no pyplot global state, no display needed.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.core.outputs import save_png
from quantkit.load.config import LoadError
from quantkit.load.parts import PARTS, TtftParts
from quantkit.load.runfile import LoadRun

# Log scale once a curve spans more than this ratio, so the flat part before the knee stays readable.
LOG_SPAN = 20.0


def _p99(step, metric: str, cls: str | None) -> float | None:
    """A level's P99 of `metric`; of the class `cls` where the SLO names one (None where the level
    has no such class: never the whole level's figure in its place)."""
    if cls:
        found = (step.classes or {}).get(cls)
        return getattr(found, metric).p99 if found else None
    return step.latency(metric).p99


def _series(run: LoadRun, metric: str, cls: str | None) -> tuple[list[float], list[float], list[float]]:
    """One point per level, by offered load: a level measured several times is its pooled summary."""
    xs, ys, levels = [], [], []
    for step in sorted(run.levels or run.steps, key=lambda s: s.offered):
        qps, p99 = step.achieved_qps, _p99(step, metric, cls)
        if qps and p99 is not None:
            xs.append(qps)
            ys.append(p99)
            levels.append(step.offered)
    return xs, ys, levels


def _slo_knee(ax, run: LoadRun, color) -> None:
    """The SLO knee in requests/s: a dashed line, its 95% interval a band (open ends not drawn)."""
    knee = run.analysis.slo_knee
    if knee is None or knee.knee_qps is None:
        return
    ax.axvline(knee.knee_qps, ls="--", lw=1, color=color)
    low, high = knee.knee_qps_ci95 or (None, None)
    if low is not None and high is not None:
        ax.axvspan(low, high, color=color, alpha=0.12, lw=0)


PART_COLORS = dict(zip(PARTS, ("#d62728", "#1f77b4", "#7f7f7f")))


def _parts(run: LoadRun) -> list[tuple[float, TtftParts]]:
    return [(s.offered, s.parts) for s in (run.levels or run.steps) if s.parts is not None]


def _plot_parts(ax, runs: list[LoadRun]) -> None:
    """Mean queue, prefill and other per offered level, stacked; one bar per run at each level."""
    offered = sorted({level for run in runs for level, _ in _parts(run)})
    width = 0.8 / max(1, len(runs))
    for k, run in enumerate(runs):
        by_level = dict(_parts(run))
        xs = [i + k * width for i, level in enumerate(offered) if level in by_level]
        bottom = [0.0] * len(xs)
        for name, color in PART_COLORS.items():
            heights = [max(0.0, by_level[lv].part(name).mean or 0.0) for lv in offered if lv in by_level]
            label = name[:-3] if k == 0 else None
            ax.bar(xs, heights, width, bottom=bottom, color=color, label=label, hatch=["", "//", "..", "xx"][k % 4])
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(offered))], [f"{lv:g}" for lv in offered])
    ax.set_title("TTFT parts (means; one bar per run, hatched in run order)")
    ax.set_xlabel(f"offered load ({runs[0].settings.mode})")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def plot_runs(runs: list[LoadRun], path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with_parts = any(_parts(run) for run in runs) and len({run.settings.mode for run in runs}) == 1
    fig = Figure(figsize=(16.5 if with_parts else 11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if with_parts else 2)
    if with_parts:
        _plot_parts(axes[2], runs)
    cls = next((run.settings.slo.cls for run in runs if run.settings.slo.cls), None)
    for ax, metric, title in zip(axes[:2], ("ttft_ms", "tpot_ms"), ("TTFT P99", "TPOT P99")):
        top = []
        for k, run in enumerate(runs):
            xs, ys, levels = _series(run, metric, cls)
            if not xs:
                continue
            (line,) = ax.plot(xs, ys, marker="o", label=run.label)
            top.extend(ys)
            for x, y, level in zip(xs, ys, levels):
                ax.annotate(f"{level:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
            _slo_knee(ax, run, line.get_color())
            knee = run.analysis.knee
            if knee and knee.achieved_qps and not cls:
                y = knee.ttft_p99_ms if metric == "ttft_ms" else knee.tpot_p99_ms
                if y is not None:
                    ax.plot(
                        [knee.achieved_qps], [y], marker="o", markersize=16, fillstyle="none", color=line.get_color()
                    )
        threshold = getattr(runs[0].settings.slo, metric) if runs else None
        if threshold is not None:
            ax.axhline(threshold, ls=":", color="0.35", lw=1, label="SLO")
            top.append(threshold)
        if top and min(top) > 0 and max(top) / min(top) > LOG_SPAN:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)  # a linear axis from zero: small changes should look small
        who = f" of {cls} prompts" if cls else ""
        ax.set_title(f"{title}{who} vs achieved load (labels: offered load)", fontsize=10)
        ax.set_xlabel("achieved requests/s")
        ax.set_ylabel(f"{title} (ms)")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "dashed: the SLO knee, its band the 95% interval; dotted: the SLO; circled: the saturation knee",
        fontsize=9,
    )
    out = Path(path)
    try:
        save_png(fig, out, dpi=110)  # marked as quantkit's (core/outputs.py), written whole
    except OSError as exc:
        raise LoadError(f"--plot: cannot write {out}: {exc.strerror or exc}") from None
    return out
