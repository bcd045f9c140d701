#!/usr/bin/env python3
"""Rebuild (or check) the license-clean texts that calib_data/ ships for the calibration mix.

Three texts, each cut from files every CPython 3.11.7 install or Debian system has, with the
license each source states (calib_data/README.md lists them):

- python-stdlib-code: whole modules of CPython's standard library (PSF License v2), code
  with its docstrings and comments — the "code" part of `mix:default`;
- python-reference: the Python Language Reference as pydoc ships it
  (`pydoc_data/topics.py`, PSF License v2) — the "technical prose" part;
- legal-licenses: the texts of seven licenses from Debian's /usr/share/common-licenses
  (each may be copied verbatim; CC0's legal code is itself in the public domain) — an
  evaluation domain that no calibration reads.

  .venv/bin/python scripts/build_calib_mix.py           # write calib_data/text/*.txt and manifests
  .venv/bin/python scripts/build_calib_mix.py --check   # rebuild in memory, compare the sha256s

The build is byte-reproducible from the same inputs: the manifests record the Python version
and each input file's sha256, and --check names the first input that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "calib_data"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
LICENSES = Path("/usr/share/common-licenses")

# Modules written for CPython and covered by the PSF License alone: none appears among the
# "incorporated software" with other terms in CPython's Doc/license.rst (asyncore, http.cookies,
# trace, uu, xmlrpc, ... are avoided for that reason).
CODE_MODULES = ("textwrap.py", "fractions.py", "statistics.py", "heapq.py", "shlex.py", "string.py", "csv.py",
                "graphlib.py", "contextlib.py", "sched.py", "queue.py", "bisect.py", "colorsys.py")
REFERENCE_CHARS = 200_000  # the first topics, in name order, up to this many characters
LEGAL_TEXTS = ("Apache-2.0", "GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "GFDL-1.3", "CC0-1.0")
PYTHON = "3.11.7"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def code_text() -> tuple[str, list[dict]]:
    parts, inputs = [], []
    for name in CODE_MODULES:
        raw = (STDLIB / name).read_bytes()
        inputs.append({"file": f"Lib/{name}", "sha256": sha256(raw)})
        parts.append(f"# ---- Lib/{name} (CPython {PYTHON}, PSF License v2) ----\n{raw.decode('utf-8')}")
    return "\n".join(parts), inputs


def reference_text() -> tuple[str, list[dict]]:
    raw = (STDLIB / "pydoc_data" / "topics.py").read_bytes()
    scope: dict = {}
    exec(compile(raw, "topics.py", "exec"), scope)  # a module of one dict literal, from the stdlib itself
    topics, out, n = scope["topics"], [], 0
    for key in sorted(topics):
        if n >= REFERENCE_CHARS:
            break
        out.append(topics[key].rstrip() + "\n")
        n += len(out[-1])
    return "\n\n".join(out), [{"file": "Lib/pydoc_data/topics.py", "sha256": sha256(raw), "topics": len(out)}]


def legal_text() -> tuple[str, list[dict]]:
    parts, inputs = [], []
    for name in LEGAL_TEXTS:
        raw = (LICENSES / name).read_bytes()
        inputs.append({"file": f"/usr/share/common-licenses/{name}", "sha256": sha256(raw)})
        parts.append(raw.decode("utf-8").strip() + "\n")
    return "\n\n".join(parts), inputs


SETS = {
    "python-stdlib-code": dict(
        build=code_text, domain="code",
        description=f"{len(CODE_MODULES)} whole modules of the CPython {PYTHON} standard library (code, docstrings, comments)",
        license="PSF License Agreement v2 (calib_data/text/LICENSE-PSF.txt)",
        use="calibration: the code part of mix:default (second half); evaluation: held-out code (first half)"),
    "python-reference": dict(
        build=reference_text, domain="technical prose",
        description=f"The Python Language Reference as pydoc ships it (CPython {PYTHON} Lib/pydoc_data/topics.py), the first topics by name",
        license="PSF License Agreement v2 (calib_data/text/LICENSE-PSF.txt)",
        use="calibration: the technical-prose part of mix:default (second half); evaluation: held-out technical prose (first half)"),
    "legal-licenses": dict(
        build=legal_text, domain="legal",
        description="License texts: " + ", ".join(LEGAL_TEXTS) + " (Debian base-files /usr/share/common-licenses)",
        license="verbatim copies: the FSF texts permit verbatim copying; CC0-1.0's legal code is dedicated to the public domain; Apache-2.0 is the license of this repository",
        use="evaluation only: a domain unlike every calibration part (no mix reads it)"),
}


def manifest(name: str, spec: dict, data: bytes, inputs: list[dict]) -> str:
    import yaml

    body = {
        "description": spec["description"],
        "domain": spec["domain"],
        "source": f"file:calib_data/text/{name}.txt",
        "sha256": sha256(data),
        "bytes": len(data),
        "license": spec["license"],
        "use": spec["use"],
        "built_by": f"scripts/build_calib_mix.py (Python {platform.python_version()})",
        "inputs": inputs,
    }
    return "# Written by scripts/build_calib_mix.py; edit the script, not this file.\n" + yaml.safe_dump(body, sort_keys=False, width=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="rebuild in memory and compare with the shipped files")
    args = ap.parse_args(argv)
    import yaml

    from quantkit.atomic import write_bytes, write_text

    bad = 0
    for name, spec in SETS.items():
        text, inputs = spec["build"]()
        data = text.encode("utf-8")
        if args.check:
            shipped = yaml.safe_load((OUT / f"{name}.yaml").read_text())
            if shipped["sha256"] != sha256(data):
                old = {i["file"]: i["sha256"] for i in shipped.get("inputs", [])}
                diff = next((i["file"] for i in inputs if old.get(i["file"]) != i["sha256"]), "the build itself")
                print(f"{name}: sha256 {sha256(data)[:12]}… differs from the shipped {shipped['sha256'][:12]}… (first differing input: {diff})")
                bad += 1
            else:
                print(f"{name}: reproduced ({len(data)} bytes, sha256 {sha256(data)[:12]}…)")
            continue
        write_bytes(OUT / "text" / f"{name}.txt", data)
        write_text(OUT / f"{name}.yaml", manifest(name, spec, data, inputs))
        print(f"{name}: {len(data)} bytes, sha256 {sha256(data)[:12]}…")
    if not args.check:
        write_bytes(OUT / "text" / "LICENSE-PSF.txt", (STDLIB / "LICENSE.txt").read_bytes())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
