"""What a checkpoint's weights are, as facts: one typed record per quantization scheme it holds.

The facts are read from what the checkpoint itself declares, its config.json `quantization_config`
(the dict transformers, vLLM and llama.cpp's converter read), and recorded in quantkit.json at
conversion. Decisions about an artifact (which vLLM kernels serve it: external/vllm_support.py;
which GGUF type holds its grid exactly: gguf/tensor_map.py) are made on these facts, never on a scheme's
name. A format none of the readers below recognises reads as `unknown`, which no decision treats
as supported.

compressed-tensors 0.19 spells a scheme as QuantizationArgs (quantization/quant_args.py): `type`
int or float, `num_bits`, `strategy` (what one scale covers), `group_size`, `symmetric`,
`scale_dtype` (None: the checkpoint's float dtype), and the same for `input_activations`, with
`dynamic` true when their scales are computed at run time. Its presets (quant_scheme.py) fix the
FP4 formats: NVFP4 is float 4-bit, strategy tensor_group (groups of 16 plus one scale per tensor),
FP8 E4M3 group scales; MXFP4 is float 4-bit, strategy group of 32, uint8 scales holding E8M0
exponents (compressors/mx_utils.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

WEIGHT_FORMATS = ("dense", "int", "float", "nvfp4", "mxfp4", "nf4", "bnb-fp4", "llm-int8", "unknown")
ACTIVATION_FORMATS = ("16-bit", "int", "float", "nvfp4", "mxfp4", "unknown")


@dataclass(frozen=True)
class SchemeFacts:
    """One scheme's weights and activations as stored and computed."""

    container: str  # the checkpoint's quant_method: dense, compressed-tensors, bitsandbytes, or another tool's name
    weights: str  # one of WEIGHT_FORMATS: int codes on a uniform grid, float (FP8 E4M3) codes, the FP4 formats, ...
    bits: int  # bits per stored weight value (16 for a dense checkpoint)
    strategy: str  # what a scale covers: group, tensor_group (groups + one per tensor), channel, tensor, block
    group_size: int | None  # weights per scale along a row, for the group strategies
    symmetric: bool  # no zero points
    scales: str  # the group scales' storage: float (the checkpoint's dtype), float8_e4m3fn, e8m0 (a power of two)
    activations: str = "16-bit"  # one of ACTIVATION_FORMATS: how each linear's input is rounded at run time
    activation_bits: int = 16
    dynamic: bool | None = None  # activation scales computed at run time (True) or calibrated (False); None: 16-bit

    @property
    def known(self) -> bool:
        return self.weights != "unknown" and self.activations != "unknown"

    @property
    def label(self) -> str:
        """How tables and cards name the scheme (a label for people; decisions read the fields)."""
        if self.weights == "dense":
            return "16-bit"
        if not self.known:
            return f"unknown ({self.container})"
        if self.container == "bitsandbytes":
            return "bitsandbytes"
        kind = {"int": f"int{self.bits}", "float": f"fp{self.bits}"}.get(self.weights, self.weights)
        return f"{kind}-w{self.bits}a{self.activation_bits}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SchemeFacts":
        """A record quantkit.json or a result file holds; anything else reads as unknown."""
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not {"container", "weights", "bits"} <= set(d) or set(d) - names:
            return unknown("unreadable facts")
        try:
            facts = cls(**d)
        except TypeError:
            return unknown("unreadable facts")
        if facts.weights not in WEIGHT_FORMATS or facts.activations not in ACTIVATION_FORMATS:
            return unknown(str(facts.container))
        return facts


DENSE = SchemeFacts("dense", "dense", 16, "none", None, True, "none")


def unknown(container: str) -> SchemeFacts:
    return SchemeFacts(container, "unknown", 0, "unknown", None, True, "unknown", "unknown", 0)


def int_weights(bits: int, group_size: int, symmetric: bool, activations: tuple = ("16-bit", 16, None)) -> SchemeFacts:
    """compressed-tensors integer weights, one float scale per group of `group_size` (-1: per output channel)."""
    strategy, group = ("channel", None) if group_size == -1 else ("group", group_size)
    return SchemeFacts("compressed-tensors", "int", bits, strategy, group, symmetric, "float", *activations)


def fp8_weights(dynamic_activations: bool) -> SchemeFacts:
    """FP8 E4M3 weights with a float scale per output channel; FP8 activations per token when dynamic."""
    acts = ("float", 8, True) if dynamic_activations else ("16-bit", 16, None)
    return SchemeFacts("compressed-tensors", "float", 8, "channel", None, True, "float", *acts)


def bnb_4bit(kind: str, double_quant: bool) -> SchemeFacts:
    """bitsandbytes' 4-bit weights in blocks of 64 (its default blocksize) with an absmax each,
    itself quantized to int8 under double quantization."""
    return SchemeFacts("bitsandbytes", kind, 4, "group", 64, True, "int8 (double quant)" if double_quant else "float32")


# LLM.int8(): int8 rows; at run time each linear's input is rounded to int8 per token, outlier columns kept in 16 bits
LLM_INT8 = SchemeFacts("bitsandbytes", "llm-int8", 8, "channel", None, True, "float", "int", 8, True)
NVFP4 = SchemeFacts("compressed-tensors", "nvfp4", 4, "tensor_group", 16, True, "float8_e4m3fn")
MXFP4 = SchemeFacts("compressed-tensors", "mxfp4", 4, "group", 32, True, "e8m0")


def from_quantization_config(qc: dict | None) -> list[SchemeFacts]:
    """Each scheme a config.json `quantization_config` declares, each once, the base scheme first."""
    if not qc:
        return [DENSE]
    if not isinstance(qc, dict):
        return [unknown("unreadable quantization_config")]
    method = str(qc.get("quant_method") or "unknown")
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        groups = sorted(groups.values(), key=_override) if isinstance(groups, dict) else []
        return list(dict.fromkeys(of_config_group(g) for g in groups)) or [unknown(method)]
    if method == "bitsandbytes":
        return [_bitsandbytes(qc)]
    return [unknown(method)]


def of_checkpoint(path: Path) -> list[SchemeFacts]:
    """The facts of a checkpoint directory, from its config.json."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    return from_quantization_config(cfg.get("quantization_config"))


def of_meta(meta: dict) -> list[SchemeFacts]:
    """The facts quantkit.json recorded (`quantization.weights`); a 16-bit artifact is dense. A
    quantkit.json written before facts were recorded reads as unknown: nothing is claimed for it."""
    q = meta.get("quantization") if isinstance(meta, dict) else None
    if not q:
        return [DENSE]
    recorded = q.get("weights") if isinstance(q, dict) else None
    if not isinstance(recorded, list) or not recorded:
        return [unknown(str(q.get("format") if isinstance(q, dict) else "") or "unrecorded")]
    return [SchemeFacts.from_dict(d) for d in recorded]


def _override(group) -> bool:
    """False for the base group (a class-name target such as `Linear`), True for an override (names,
    `re:` patterns): the base scheme is listed first, as compressed-tensors' precedence ranks it last."""
    targets = group.get("targets") if isinstance(group, dict) else None
    return not any(isinstance(t, str) and not t.startswith("re:") and "." not in t for t in targets or [])


def _dtype_name(value) -> str | None:
    return None if value is None else str(value).removeprefix("torch.")


def _strategy(args: dict) -> str:
    return str(args.get("strategy") or ("group" if args.get("group_size") else "channel"))


def _float_format(bits, strategy: str, group_size, scales: str | None) -> str:
    """float codes: FP8 E4M3 (8 bits), or one of the FP4 formats by its layout."""
    if bits == 8:
        return "float"
    if bits == 4 and strategy == "tensor_group" and group_size == 16 and scales == "float8_e4m3fn":
        return "nvfp4"
    if bits == 4 and strategy == "group" and group_size == 32 and scales == "uint8":
        return "mxfp4"
    return "unknown"


def of_config_group(group: dict) -> SchemeFacts:
    """One compressed-tensors config group's scheme (its `weights` and `input_activations`)."""
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        return unknown("compressed-tensors")  # activation-only quantization, or an unreadable group
    w = group["weights"]
    bits, strategy, scales = w.get("num_bits"), _strategy(w), _dtype_name(w.get("scale_dtype"))
    group_size = w.get("group_size") if strategy in ("group", "tensor_group") else None
    if not isinstance(bits, int):
        return unknown("compressed-tensors")
    if w.get("type", "int") == "int":
        weights = "int"
    elif w.get("type") == "float":
        weights = _float_format(bits, strategy, group_size, scales)
    else:
        weights = "unknown"
    if weights == "mxfp4":
        scales = "e8m0"  # uint8 holding biased exponents: scale = 2 ** (e - 127) (compressors/mx_utils.py)
    return SchemeFacts(
        "compressed-tensors",
        weights,
        bits,
        strategy,
        group_size,
        bool(w.get("symmetric", True)),
        scales or "float",
        *_activations(group.get("input_activations")),
    )


def _activations(a) -> tuple[str, int, bool | None]:
    if not a:
        return "16-bit", 16, None
    if not isinstance(a, dict) or not isinstance(a.get("num_bits"), int):
        return "unknown", 0, None
    bits, strategy = a["num_bits"], _strategy(a)
    if a.get("type", "int") == "int":
        kind = "int"
    elif a.get("type") == "float":
        kind = _float_format(bits, strategy, a.get("group_size"), _dtype_name(a.get("scale_dtype")))
    else:
        kind = "unknown"
    return kind, bits, a.get("dynamic") not in (False, None)  # True or "local" (NVFP4's per-group, run time)


def _bitsandbytes(qc: dict) -> SchemeFacts:
    """transformers' BitsAndBytesConfig (4-bit NF4/FP4, or LLM.int8())."""
    if qc.get("load_in_4bit"):
        kind = {"nf4": "nf4", "fp4": "bnb-fp4"}.get(str(qc.get("bnb_4bit_quant_type", "fp4")), "unknown")
        return bnb_4bit(kind, bool(qc.get("bnb_4bit_use_double_quant")))
    if qc.get("load_in_8bit"):
        return LLM_INT8
    return unknown("bitsandbytes")
