#!/usr/bin/env python3
"""Run `quantkit convert ARGS...` in this process while sampling its resident set size every
50 ms; prints one JSON line on stderr at exit: the peak, the phase it fell in, and the RSS at
each progress note (load, quantize, export, reload check). Used by benchmarks/scale.py.

  python benchmarks/rss.py int4-w4a16-rtn --model M --out O
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time

import psutil

import quantkit.quantize.convert as convert
import quantkit.quantize.verify as verify
from quantkit.cli import cli

state = {"phase": "start", "peak": 0, "peak_phase": "start", "notes": [], "phase_peak": 0, "t0": time.perf_counter()}


def _sample() -> None:
    proc = psutil.Process()
    while True:
        rss = proc.memory_info().rss
        state["phase_peak"] = max(state["phase_peak"], rss)
        if rss > state["peak"]:
            state["peak"], state["peak_phase"] = rss, state["phase"]
        time.sleep(0.05)


def _mark(phase: str) -> None:
    now = time.perf_counter() - state["t0"]
    state["notes"].append(
        {
            "phase": state["phase"],
            "rss_mb_at_end": psutil.Process().memory_info().rss / 1e6,
            "peak_mb": state["phase_peak"] / 1e6,
            "end_s": round(now, 2),
        }
    )
    state["phase"], state["phase_peak"] = phase, 0


_note, _export, _reload = convert.note, convert.export_verified, verify.verify_reload
convert.note = lambda msg: (_mark(msg.split(":")[0][:40]), _note(msg))[1]
verify.verify_reload = lambda *a, **k: (_mark("reload check"), _reload(*a, **k))[1]
convert.export_verified = lambda *a, **k: (_mark("export"), _export(*a, **k))[1]
atexit.register(
    lambda: (
        _mark("exit"),
        print(
            json.dumps({"peak_mb": state["peak"] / 1e6, "peak_phase": state["peak_phase"], "phases": state["notes"]}),
            file=sys.stderr,
        ),
    )
)
threading.Thread(target=_sample, daemon=True).start()
cli(["convert", *sys.argv[1:]], prog_name="quantkit")
