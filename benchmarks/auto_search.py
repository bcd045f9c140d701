#!/usr/bin/env python3
"""Auto mixed precision's lazy search against measuring every unit at every choice: the same
units chosen, at what share of the forwards and of the time.

On one model (default: the demo), the windows a recipe's `auto:` reads (the calibration source's
seeded windows, `--windows` x `--seq-len`), each budget is searched both ways in one process
(quantize/auto.py `search`, lazy and not), the lazy one first, so both see the same machine state
as nearly as one run allows.

  OMP_NUM_THREADS=1 python benchmarks/auto_search.py --budgets 4.5 4.75 --choices int8 --asymmetric
"""

from __future__ import annotations

import argparse
import time

from common import write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--calib", default="mix:default")
    ap.add_argument("--budgets", nargs="+", type=float, default=[4.5])
    ap.add_argument("--choices", default="int8")
    ap.add_argument("--asymmetric", action="store_true", help="asymmetric INT4 g64 base, as the best INT4 recipe")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument(
        "--dtype", default="bfloat16", help="the pass's precision (convert's compute dtype for the demo's recipes)"
    )
    ap.add_argument("--name", default="auto-search")
    args = ap.parse_args()

    import torch

    from quantkit.cli.sensitivity_cmd import _search
    from quantkit.data import calib
    from quantkit.methods.schemes import UNITS
    from quantkit.models.checkpoint import load_model, load_tokenizer, read_config
    from quantkit.models.resolve import resolve_path
    from quantkit.quantize.auto import search

    src = resolve_path(args.model)
    tok = load_tokenizer(src)
    model = load_model(src, dtype=args.dtype, device=torch.device("cpu"))
    cs = calib.build(
        src,
        tok,
        args.calib,
        samples=args.windows,
        seq_len=args.seq_len,
        seed=0,
        region="second-half",
        chat_template=False,
        model=model,
        model_hash="",
    )
    rows = torch.cat(cs.samples)
    out = []
    for budget in args.budgets:
        spec = _search(read_config(src), 64, not args.asymmetric, args.choices, list(UNITS), budget)
        runs = {}
        for lazy in (True, False):
            t0 = time.perf_counter()
            r = search(model, rows, spec, lazy=lazy)
            runs[lazy] = (r, time.perf_counter() - t0)
        (lz, lz_s), (full, full_s) = runs[True], runs[False]
        out.append(
            {
                "budget_bits": budget,
                "base": spec.base.name,
                "choices": args.choices,
                "units": len(full["ranking"]),
                "raised": len(full["picked"]),
                "same_choice": lz["picked"] == full["picked"],
                "bits_per_weight": lz["bits_per_weight"],
                "kl_sum": lz["kl_sum"],
                "full_forwards": full["measured"]["unit_forwards"],
                "lazy_forwards": lz["measured"]["unit_forwards"],
                "lazy_units_at_every_scheme": lz["measured"]["units_at_every_scheme"],
                "solves": lz["measured"]["solves"],
                "full_s": round(full_s, 1),
                "lazy_s": round(lz_s, 1),
                "time_ratio": round(lz_s / full_s, 3),
            }
        )
        print(out[-1], flush=True)
    columns = [
        ("budget_bits", "budget bits/weight", "{:.2f}"),
        ("base", "base", "{}"),
        ("choices", "choices", "{}"),
        ("raised", "units raised", "{}"),
        ("units", "units", "{}"),
        ("same_choice", "same units", "{}"),
        ("full_forwards", "forwards, every unit at every scheme", "{}"),
        ("lazy_forwards", "forwards, lazy", "{}"),
        ("lazy_units_at_every_scheme", "units measured at every scheme, lazy", "{}"),
        ("solves", "solves", "{}"),
        ("full_s", "every unit s", "{:.0f}"),
        ("lazy_s", "lazy s", "{:.0f}"),
        ("time_ratio", "lazy / every", "{:.2f}"),
    ]
    write_result(
        args.name,
        {
            "model": args.model,
            "windows": args.windows,
            "seq_len": args.seq_len,
            "calib": args.calib,
            "dtype": args.dtype,
            "threads": torch.get_num_threads(),
            "rows": out,
            "tables": {
                "main": {
                    "columns": [{"key": k, "header": h, "fmt": f} for k, h, f in columns],
                    "rows": out,
                    "note": f"Both searches on the same windows in one process on {torch.get_num_threads()} "
                    "thread(s), the lazy one first; "
                    "forwards: the unit forwards (each from the unit's layer on) and the noise "
                    "checks, beside the reference and the noise floor's 3 common to both.",
                }
            },
        },
    )


if __name__ == "__main__":
    main()
