"""Which texts an evaluation reads, and the label each gets (one report row per domain).

An accuracy figure on one domain is not the model's: GPTQ calibrated on WikiText lost its whole
lead over RTN on legal text. So `quantkit eval` and
`quantkit run` take several texts and, given none, evaluate on at least two domains.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.data.sources import label_of
from quantkit.data.text import configured, content_key, parse_spec
from quantkit.errors import DataError

# The default domains: encyclopedic prose whose first half no calibration reads (the mix calibrates
# on its second half) and literature that no calibration reads at all, both shipped, so a first run
# measures on the same two real domains on every machine. WikiText-2 (CC BY-SA, not shipped) joins
# them where the user keeps a copy (QUANTKIT_WIKITEXT2_VALID; calib_data/wikitext2-valid.yaml).
DEFAULT_SETS = ("world-factbook", "shakespeare-plays")
CONFIGURED_SETS = ("wikitext2-valid",)
MIN_DEFAULT_DOMAINS = 2


def labelled(specs, option: str = "--text") -> list[tuple[str, str]]:
    """[(label, spec)] in the order given; the same text twice is a user error - the same SPEC, or
    two SPECs naming the same content (a symlink, a byte-identical copy, a set and its file:
    text.content_key), which would be scored as two domains - and two different texts with one
    name (two files called eval.txt) are told apart by a suffix."""

    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    seen_labels = set()
    for spec in specs:
        spec = str(spec).strip()
        if not spec:
            raise DataError(f"{option}: an empty text SPEC")
        if spec in seen:
            raise DataError(f"{option} {spec} is given twice; each domain is evaluated once")
        key = content_key(spec)
        first = next((s for s, k in seen.items() if key is not None and k == key), None)
        if first is not None:
            same = f" (sha256 {key[7:19]}…)" if key.startswith("sha256:") else ""
            raise DataError(
                f"{option} {spec} is the same text as {option} {first}{same}; each domain is evaluated once"
            )
        seen[spec] = key
        label, n = label_of(spec), 2
        while label in seen_labels:
            label = f"{label_of(spec)}-{n}"
            n += 1
        seen_labels.add(label)
        out.append((label, spec))
    return out


def _available(name: str) -> bool:
    """The set's manifest exists and its file is on this machine."""

    if not configured(name):
        return False
    spec = parse_spec(f"set:{name}")
    return not spec.source.local or Path(spec.path).expanduser().is_file()


def default_texts() -> list[str]:
    """The shipped default domains, plus WikiText-2 where the user has configured it; refused in one
    line when fewer than two can be found (a calib_data/ removed from an install)."""
    found = [f"set:{n}" for n in DEFAULT_SETS if _available(n)]
    if len(found) < MIN_DEFAULT_DOMAINS:
        raise DataError(
            f"no --text given and only {len(found)} of the default domains ({', '.join(DEFAULT_SETS)}) "
            "are installed; pass --text SPEC (repeatable)"
        )
    return found + [f"set:{n}" for n in CONFIGURED_SETS if _available(n)]
