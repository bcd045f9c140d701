"""How a bench row's figures show: each BenchRow field (bench_records.py) that is a column carries
its `Column`s in its dataclass metadata, and every table reads them from there, so a new figure is
its field, its producer and its test. The tables: `quantkit bench`'s table and its --csv (BENCH),
and the run report's table (REPORT: report.md, with the value in the row of report.json); the
plots name their axes from the same columns.

A field may show in both tables (a Column for each) and as several cells (the attribution: where
TPOT goes, what bounds it, the attributed time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

BENCH = "bench"  # quantkit bench's table and its --csv
REPORT = "report"  # the run report's table, the value kept in report.json's row
MISSING = "—"  # a cell with no value (TTFT at depth 0, a row without attribution)


@dataclass(frozen=True)
class Column:
    """One cell of a row in one table."""

    table: str  # BENCH or REPORT
    header: str  # what is shown, without its unit ("TPOT")
    unit: str = ""  # "ms"; the header shows it after a space, a plot's axis in brackets
    place: int = 1000  # order among the table's columns, lowest first (a column without one goes last)
    digits: int | None = None  # BENCH: the number rounded to this many decimals (None: as it is)
    divisor: float = 1.0  # the field's value divided by this first (bytes -> MB: 1e6)
    fmt: str = "{}"  # REPORT: how a present value is written
    key: str = ""  # REPORT: the report row's key (empty: the field's name)
    cell: Callable[[Any], Any] | None = None  # the cell from the whole row (a derived one); None: the field's value
    # BENCH: shown only where this holds of the table's rows (a setting that varies among them)
    shown: Callable[[list], bool] | None = None
    name: str = ""  # the field it belongs to (filled in by `columns`)

    @property
    def title(self) -> str:
        return f"{self.header} {self.unit}" if self.unit else self.header

    @property
    def axis(self) -> str:
        return f"{self.header} ({self.unit})" if self.unit else self.header

    def value(self, row) -> Any:
        """The cell of `row` (a BenchRow): MISSING where a field's value is None."""
        if self.cell is not None:
            return self.cell(row)
        v = getattr(row, self.name)
        if v is None:
            return MISSING
        v = v / self.divisor if self.divisor != 1.0 else v
        return round(v, self.digits) if self.digits is not None else v


def shown_as(*cols: Column, **kw) -> Any:
    """A dataclass field that shows as `cols` (kw: the field's default)."""
    return field(metadata={"columns": cols}, **kw)


def columns(record: type, table: str) -> list[Column]:
    """The columns `table` shows of a record class, in their order, each bound to its field."""
    out = [
        replace(c, name=f.name, key=c.key or f.name)
        for f in fields(record)
        for c in f.metadata.get("columns", ())
        if c.table == table
    ]
    return sorted(out, key=lambda c: c.place)


def table_rows(rows: list, record: type) -> list[dict]:
    """quantkit bench's table: a dict per row, header -> cell, of the BENCH columns the rows show."""
    cols = [c for c in columns(record, BENCH) if c.shown is None or c.shown(rows)]
    return [{c.title: c.value(r) for c in cols} for r in rows]


def report_cells(row, record: type) -> dict:
    """The REPORT columns' values of a row, by their report keys (those with a value)."""
    out = {c.key: c.value(row) for c in columns(record, REPORT)}
    return {k: v for k, v in out.items() if v is not None and v != MISSING}


# ---------------------------------------------------------------- derived cells


def varies(attr: str) -> Callable[[list], bool]:
    """Shown where the rows differ in `attr`."""
    return lambda rows: len({getattr(r, attr) for r in rows}) > 1


def any_depth(rows: list) -> bool:
    return any(r.depth is not None for r in rows)


def levers_vary(rows: list) -> bool:
    """The rows differ in their flash-attention setting."""
    return any(r.flash_attn is not None for r in rows) and varies("flash_attn")(rows)


def depth(r):
    return r.depth


def on_off(r) -> str:
    return "on" if r.flash_attn else "off"


def runs_on(r) -> str:
    """The CPU variant (ggml's, or ATen's kernels) and the dtype a row ran, in one cell."""
    return " · ".join(str(x) for x in (r.cpu_variant, r.dtype) if x) or MISSING


def tpot_eff(r) -> str:
    return (
        f"{r.tpot_efficiency * 100:.0f}%"
        + (" (!)" if "tpot_above_roofline" in r.flags else "")
        + (" (fits in cache)" if r.fits_in_cache and r.tpot_efficiency > 1 else "")
    )


def tpot_pct(r) -> float:
    return r.tpot_efficiency * 100


def ttft_eff(r) -> str:
    if r.ttft_efficiency is None:
        return MISSING
    return f"{r.ttft_efficiency * 100:.0f}%" + (" (!)" if "ttft_above_roofline" in r.flags else "")


def split(r) -> str:
    """Where the row's TPOT goes: each term's share of the attributed step."""
    a = r.attribution
    if a is None:
        return MISSING
    sh = a.shares()
    return (
        f"weights {sh['weights']:.0%} · compute {sh['compute']:.0%} · KV {sh['kv']:.0%} · overhead {sh['overhead']:.0%}"
    )


def split_summed(r) -> str:
    """`split`, and what the terms sum to where that is not the measured TPOT."""
    a = r.attribution
    return split(r) + ("" if a is None or a.holds else f" (sums to {a.explained:.0%})")


def attributed(r) -> str:
    a = r.attribution
    return MISSING if a is None else f"{a.total_ms:.2f} ({a.explained:.0%})"


def bound(r) -> str:
    return MISSING if r.attribution is None else r.attribution.bound


def self_check_kl(r):
    check = r.self_check
    return f"{check.mean_kl:.2g}" if check.mean_kl is not None else check.status
