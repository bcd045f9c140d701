"""ParetoSettings: everything `quantkit pareto` runs with, as one frozen record whose fields are
also the command's options (core/option_fields.py; cli/_options.py makes the click options), checked
once where it is built (one line, exit 2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from quantkit.core.option_fields import FLAG, FLOATS, MANY, WORDS, bound_error, option
from quantkit.errors import QuantkitError
from quantkit.evals.splits import SPLITS
from quantkit.pipeline.front import DEFAULT_ANCHORS, DEFAULT_CT_RECIPE, DEFAULT_SIZES, DEFAULT_TEXTS, LINES, SIZE_RANGE
from quantkit.recipe.schema import GGUF_MIXABLE, GGUF_TYPES


@dataclass(frozen=True)
class ParetoSettings:
    """Everything `quantkit pareto` runs with, checked once where it is built (one line, exit 2)."""

    model: str  # as the user spelled it: the front's title and record name no directory of this machine
    out: Path
    calib: str = option("mix:default", help="Calibration text of every choice.", metavar="SPEC")
    sizes: tuple[float, ...] = option(
        DEFAULT_SIZES,
        help=f"Bits/weight to compare at ({SIZE_RANGE[0]:g} to {SIZE_RANGE[1]:g}); compressed-tensors' budgets.",
        cli=FLOATS,
    )
    anchors: tuple[str, ...] = option(DEFAULT_ANCHORS, help="llama.cpp types (each also --mixed's size).", cli=WORDS)
    texts: tuple[str, ...] = option(
        DEFAULT_TEXTS,
        help="Evaluation text, repeatable (default: " + ", ".join(DEFAULT_TEXTS) + ").",
        flag="--text",
        cli=MANY,
        metavar="SPEC",
    )
    split: str = option(
        "confirmation", help="The held-out windows scored (confirmation: where no choice was made).", choices=SPLITS
    )
    calib_samples: int = option(128, help="Calibration windows of every choice.", ge=1)
    calib_seq_len: int = option(512, help="Tokens per calibration window.", ge=8)
    seq_len: int = option(512, help="Tokens per eval window.", ge=8)
    max_tokens: int = option(4096, help="Tokens per text.", ge=8)
    # None: export --mixed's default list
    mixed_types: tuple[str, ...] | None = option(
        None, help="--mixed's types (default: export's list).", cli=WORDS, metavar="TYPES"
    )
    ct_recipe: str = option(DEFAULT_CT_RECIPE, help="The auto: recipe of the budgets.")
    lines: tuple[str, ...] = option(tuple(LINES), help="The lines of the front to make.", cli=WORDS)
    kl: str | None = "exact"  # the eval's --kl; None: what each engine gives
    rerun: bool = option(False, help="Make every point again instead of reusing finished ones.", cli=FLAG)
    debug: bool = False  # the command's --debug

    def __post_init__(self) -> None:
        error = bound_error(self)
        if error:
            raise QuantkitError(error)
        # names as given, each once; types in capitals
        object.__setattr__(self, "anchors", tuple(dict.fromkeys(a.upper() for a in self.anchors)))
        object.__setattr__(self, "lines", tuple(dict.fromkeys(self.lines)))
        if self.mixed_types is not None:
            object.__setattr__(self, "mixed_types", tuple(dict.fromkeys(t.upper() for t in self.mixed_types)) or None)
        lo, hi = SIZE_RANGE
        if not self.sizes:
            raise QuantkitError("--sizes: give at least one size in bits/weight, e.g. 3.5,4,4.5,5,5.5")
        bad = [s for s in self.sizes if not lo <= s <= hi]
        if bad:
            raise QuantkitError(f"--sizes {bad[0]:g}: sizes are bits/weight between {lo:g} and {hi:g}")
        if list(self.sizes) != sorted(set(self.sizes)):
            object.__setattr__(self, "sizes", tuple(sorted(set(self.sizes))))
        unknown = [a for a in self.anchors if a not in GGUF_TYPES]
        if unknown or not self.anchors:
            raise QuantkitError(
                f"--anchors {unknown[0] if unknown else '(none)'}: not a type quantkit makes with llama-quantize; "
                f"valid: {', '.join(GGUF_TYPES)}"
            )
        bad_lines = [n for n in self.lines if n not in LINES]
        if bad_lines or not self.lines:
            raise QuantkitError(
                f"--lines {bad_lines[0] if bad_lines else '(none)'}: not a line of the front; valid: {', '.join(LINES)}"
            )
        bad_types = [t for t in self.mixed_types or () if t not in GGUF_MIXABLE]
        if bad_types:
            raise QuantkitError(
                f"--mixed-types {bad_types[0]}: not a type a weight may take; valid: {', '.join(GGUF_MIXABLE)}"
            )
        if len(self.texts) < 1 or len(set(self.texts)) != len(self.texts):
            raise QuantkitError("--text: give each text once, at least one")

    @property
    def gguf_lines(self) -> bool:
        return any(LINES[n].format == "gguf" for n in self.lines)

    def to_json(self) -> dict:
        d = asdict(self)
        return d | {"out": str(self.out), "sizes": list(self.sizes), "anchors": list(self.anchors)}
