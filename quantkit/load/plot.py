"""PNG of TTFT-P99 and TPOT-P99 against achieved QPS, one line per load run, knees circled.

Uses matplotlib's object API with the Agg canvas: no pyplot global state, no display needed.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.core.outputs import save_png
from quantkit.load.config import LoadError

# Log scale once a curve spans more than this ratio, so the flat part before the knee stays readable.
LOG_SPAN = 20.0


def _series(run: dict, metric: str) -> tuple[list[float], list[float], list[float]]:
    xs, ys, levels = [], [], []
    for step in run["steps"]:
        qps, p99 = step.get("achieved_qps"), (step.get(metric) or {}).get("p99")
        if qps and p99 is not None:
            xs.append(qps)
            ys.append(p99)
            levels.append(step["offered"])
    return xs, ys, levels


def plot_runs(runs: list[dict], path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, metric, title in zip(axes, ("ttft_ms", "tpot_ms"), ("TTFT P99", "TPOT P99")):
        top = []
        for k, run in enumerate(runs):
            xs, ys, levels = _series(run, metric)
            if not xs:
                continue
            (line,) = ax.plot(xs, ys, marker="o", label=run.get("label", "run"))
            top.extend(ys)
            for x, y, level in zip(xs, ys, levels):
                ax.annotate(f"{level:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
            knee = (run.get("analysis") or {}).get("knee")
            if knee and knee.get("achieved_qps"):
                y = knee["ttft_p99_ms" if metric == "ttft_ms" else "tpot_p99_ms"]
                if y is not None:
                    ax.plot(
                        [knee["achieved_qps"]], [y], marker="o", markersize=16, fillstyle="none", color=line.get_color()
                    )
                    ax.annotate(
                        "knee",
                        (knee["achieved_qps"], y),
                        textcoords="offset points",
                        xytext=(8, -14 - 12 * k),
                        color=line.get_color(),
                    )
        if top and min(top) > 0 and max(top) / min(top) > LOG_SPAN:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)  # a linear axis from zero: small changes should look small
        ax.set_title(f"{title} vs achieved load (labels: offered load)")
        ax.set_xlabel("achieved requests/s")
        ax.set_ylabel(f"{title} (ms)")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    out = Path(path)
    try:
        save_png(fig, out, dpi=110)  # marked as quantkit's (core/outputs.py), written whole
    except OSError as exc:
        raise LoadError(f"--plot: cannot write {out}: {exc.strerror or exc}") from None
    return out
