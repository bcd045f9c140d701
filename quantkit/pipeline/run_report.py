"""A run's report.json read back (`quantkit compare`): checked where it is read, one line naming the
file and the key (exit 2), never a KeyError or a TypeError further on.

What is checked: the kind and the schema version (a whole number this quantkit reads, never `"4"`
or `true`), no key that no schema wrote, and the values `compare` shows: the recipe, date and host
as text; the rows as a list of objects, each with its name, and its figures finite numbers (or null
where not measured), its KL's kind and status text; the device and the fit as objects.
"""

from __future__ import annotations

from quantkit.core.record_checks import (
    LIST,
    NONNEG_OR_NONE,
    OBJECT_OR_NONE,
    TEXT,
    TEXT_OR_NONE,
    Num,
    RecordError,
    check_values,
)

KIND = "quantkit-run"
READS = (1, 2, 3, 4, 5)  # report.py's schema versions; a file without one is schema 1
# every top-level key a report of any schema holds (pipeline/report.py finish_run)
KEYS = frozenset(
    (
        "kind schema_version recipe model model_sha256 date host eval_text eval_texts calibration accuracy "
        "positions depths long_context bench_settings device fit engines fastest rows variants plots timings "
        "wall_seconds steps_seconds overhead_pct failed"
    ).split()
)
REQUIRED = ("recipe", "date", "host", "rows")
NUMBER_OR_NONE = Num(none=True)
ROW_VALUES = {
    "tpot_ms": NONNEG_OR_NONE,
    "ttft_ms": NONNEG_OR_NONE,
    "predicted_tpot_ms": NONNEG_OR_NONE,
    "tpot_efficiency_pct": NONNEG_OR_NONE,
    "delta_ppl_pct": NUMBER_OR_NONE,
    "kld_mean": NONNEG_OR_NONE,
    "bits_per_weight": NONNEG_OR_NONE,
    "kl_kind": TEXT_OR_NONE,
    "status": TEXT_OR_NONE,
    "engine": TEXT_OR_NONE,
}
FIT_VALUES = {"effective_gbps": NUMBER_OR_NONE, "overhead_ms": NUMBER_OR_NONE, "r2": NUMBER_OR_NONE}


def read_report(data, where: str) -> dict:
    """`data` (a parsed report.json) after its checks; RecordError names `where` and the key."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object, not {type(data).__name__}")
    if data.get("kind") != KIND:
        raise RecordError(f"{where}: kind {data.get('kind')!r}, not {KIND!r}")
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or version not in READS:
        raise RecordError(f"{where}: schema_version {version!r}: this quantkit reads {', '.join(map(str, READS))}")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise RecordError(f"{where}: unknown key {unknown[0]!r} in a run report")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise RecordError(f"{where}: missing key {missing[0]!r} in a run report")
    rules = dict.fromkeys(("recipe", "date", "host"), TEXT) | {"rows": LIST}
    check_values(data, rules | {"device": OBJECT_OR_NONE, "fit": OBJECT_OR_NONE}, where)
    if data.get("device"):
        check_values(data["device"], {"name": TEXT_OR_NONE} if "name" in data["device"] else {}, f"{where}: device")
    fit = data.get("fit") or {}
    check_values(fit, {k: r for k, r in FIT_VALUES.items() if k in fit}, f"{where}: fit")
    if fit.get("effective_gbps") and any(fit.get(k) is None for k in ("overhead_ms", "r2")):
        raise RecordError(f"{where}: fit: an effective bandwidth without its overhead_ms and r2")
    for i, row in enumerate(data["rows"]):
        what = f"{where}: rows[{i}]"
        if not isinstance(row, dict):
            raise RecordError(f"{what}: expected a JSON object, not {type(row).__name__}")
        if "name" not in row:
            raise RecordError(f"{what}: missing key 'name'")
        check_values(row, {"name": TEXT} | {k: r for k, r in ROW_VALUES.items() if k in row}, what)
    return data
