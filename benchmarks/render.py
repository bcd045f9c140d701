#!/usr/bin/env python3
"""Render docs tables from committed result files, so that a figure cannot drift from its source.

A docs page marks a table with two comments; everything between them is rewritten:

    <!-- results: accuracy-demo#main -->
    ...the table, its command, machine and date...
    <!-- /results -->

`accuracy-demo` is benchmarks/results/accuracy-demo.json and `main` one of its `tables`: a list of
`columns` ({"key", "header", "fmt"}: a str.format spec applied to the row's value; a missing value
prints "—") and `rows` (dicts). Below each table: the command, the machine and the date from the file
(or from the table's own `source`, when a later run of the script kept a table an earlier one made).

  python benchmarks/render.py            # rewrite every marked table under docs/ and README.md
  python benchmarks/render.py --check    # exit 1 and name the page when a table differs from its file
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARK = re.compile(r"(<!-- results: ([A-Za-z0-9._-]+)#([A-Za-z0-9_-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def cell(value, fmt: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, (list, tuple)) and "{0" in fmt:
        return fmt.format(*value)
    try:
        return fmt.format(value)
    except (ValueError, TypeError, IndexError):
        return str(value)


def machine_line(m: dict) -> str:
    flags = "/".join(f.upper().replace("_", "-") for f in m.get("cpu_flags", []) if f.startswith(("avx512", "amx")))
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    return (
        f"{m.get('cpu', '?')}{' (' + flags + ')' if flags else ''}, "
        f"{m.get('cores', '?')} cores, {m.get('ram_gb', '?')} GB{gpu}"
    )


def table(result: dict, name: str) -> str:
    spec = result["tables"][name]
    cols = spec["columns"]
    lines = ["| " + " | ".join(c["header"] for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in spec["rows"]:
        lines.append("| " + " | ".join(cell(row.get(c["key"]), c.get("fmt", "{}")) for c in cols) + " |")
    if spec.get("note"):
        lines += ["", spec["note"]]
    src = spec.get("source") or result  # a table an earlier run made, kept in the file beside newer ones: its own run
    lines += [
        "",
        f"<sub>`{src['command']}` · {machine_line(src.get('machine', {}))} · {src.get('date', '?')[:10]}</sub>",
    ]
    return "\n".join(lines) + "\n"


def render_text(text: str, page: str) -> str:
    def sub(m: re.Match) -> str:
        path = RESULTS / f"{m.group(2)}.json"
        if not path.is_file():
            raise SystemExit(f"{page}: no result file {path.relative_to(REPO)}")
        result = json.loads(path.read_text())
        if m.group(3) not in result.get("tables", {}):
            raise SystemExit(
                f"{page}: {path.name} has no table {m.group(3)!r} (has: {', '.join(result.get('tables', {}))})"
            )
        return m.group(1) + table(result, m.group(3)) + m.group(5)

    return MARK.sub(sub, text)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    stale = []
    for page in pages():
        old = page.read_text()
        new = render_text(old, str(page.relative_to(REPO)))
        if new != old:
            stale.append(page.relative_to(REPO))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print(
            "tables differ from their result files: "
            + ", ".join(map(str, stale))
            + " (run python benchmarks/render.py)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
