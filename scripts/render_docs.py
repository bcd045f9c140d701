#!/usr/bin/env python3
"""Write the docs tables that are views of a registry, so adding an entry edits no docs by hand:
docs/ARCHITECTURE.md's "What each exporter takes" table is export/export_registry.py's
capability_table(), and tests/test_architecture_doc.py fails while the copy differs from it.

  .venv/bin/python scripts/render_docs.py           # write the table again
  .venv/bin/python scripts/render_docs.py --check   # exit 1 where the copy differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from quantkit.export.export_registry import capability_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
SECTION = "## What each exporter takes\n"


def render(doc: str) -> str:
    """`doc` with its capability table (the section's tables, to the next heading) rendered anew."""
    start = doc.index(SECTION) + len(SECTION)
    table = doc.index("\n| ", start) + 1
    nxt = re.compile(r"^## ", re.M).search(doc, table)
    end = nxt.start() if nxt else len(doc)
    return doc[:table] + capability_table() + ("\n" + doc[end:] if nxt else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 where the copy differs")
    args = parser.parse_args()
    doc = DOC.read_text()
    new = render(doc)
    if args.check:
        if new != doc:
            print(f"{DOC}: the capability table differs from the registry's; run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    if new != doc:
        DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
