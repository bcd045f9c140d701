"""The cost of a GGUF that llama.cpp's tools make (`export --type T`, `--mixed`), for `--plan`: pure
numbers in, a Plan out, as costs/formulas.py does for convert, eval and bench.

What it counts (gguf/llama_quantize.py, quantize/kquant_chooser.py, quantize/kquant_gptq.py):
- the exact F16 GGUF of the checkpoint (read and written once);
- llama-imatrix: a forward of the calibration tokens through llama.cpp at F16 (once per checkpoint
  and calibration: kept in QUANTKIT_HOME/imatrix, so the front's first GGUF pays it);
- llama-quantize: once for T, and with --mixed once more for T's own file and once per candidate
  type (each weight at each type, --pure);
- --mixed's choice: the model loaded in float32, a forward and a backward per window and label
  draw (K-FAC's statistics), and per weight and candidate its 16-bit values dequantized and the
  quadratic form ½ tr(G ΔW A ΔWᵀ);
- --mixed's codes (GPTQ): a bfloat16 forward of the calibration tokens for each input's second
  moment, each weight's grid read from its blocks, a Cholesky inverse and a column loop per weight.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from quantkit.costs.formulas import (
    BASE_RSS,
    LOAD_BPS,
    MATMUL_EFF,
    Machine,
    Model,
    Plan,
    check_fit,
    forward_flops,
    hessian_flops,
    model_dict,
)

# Measured on the demo (SmolLM2-135M) on the 2-core shared AMD EPYC these docs were written on,
# each as a share of the quick probe's rate or a rate of its own; another machine scales by its probe.
LLAMA_EFF = 0.16  # llama-imatrix's F16 forward: 4.5 TFLOP of 32 x 512 tokens in 671 s, probe 42 GFLOP/s fp32
F16_EXPORT_BPS = 0.1e9  # bytes of the checkpoint per second: read, the GGUF written and hashed
QUANTIZE_PPS = 8e6  # parameters per second of one llama-quantize run with an importance matrix
DEQUANT_VPS = 20e6  # values per second the gguf library dequantizes (numpy)
GRID_VPS = 0.6e6  # values per second whose scale and offset gguf/codes.py reads (two dequantizations)
GPTQ_COLUMN_S = 2.2e-3  # one column of GPTQ's loop on a 1536-row weight, one thread
STARTUP_S = 10.0


@dataclass(frozen=True)
class KquantWork:
    """One GGUF made by llama.cpp's tools, and (with candidates) quantkit's --mixed choice on it."""

    calib_tokens: int  # llama-imatrix's tokens (0: none, or kept from an earlier export)
    seq_len: int
    gguf_bytes: int  # the file it writes (about)
    candidates: int = 0  # --mixed: the types each weight is measured at (0: no --mixed)
    fisher_tokens: int = 0  # --mixed: windows x tokens x label draws, a forward and backward each
    fisher_seq_len: int = 0
    gptq_tokens: int = 0  # --mixed: the calibration tokens GPTQ's second moments are summed over


def kquant_time(m: Model, w: KquantWork, mc: Machine) -> dict:
    t = {"startup": STARTUP_S, "f16_export": m.weight_bytes / F16_EXPORT_BPS}
    if w.calib_tokens:
        t["imatrix"] = forward_flops(m, w.calib_tokens, w.seq_len, with_head=True) / (mc.fp32_flops * LLAMA_EFF)
    runs = 1 + (1 + w.candidates if w.candidates else 0)
    t["llama_quantize"] = runs * m.params / QUANTIZE_PPS
    if w.candidates:
        weights = m.layers * m.layer_linear_params
        t["mixed_load"] = m.params * 4 / LOAD_BPS
        t["fisher"] = (
            3 * forward_flops(m, w.fisher_tokens, w.fisher_seq_len, with_head=True) / (mc.fp32_flops * MATMUL_EFF)
        )
        kfac = 2.0 * m.layers * sum(o * o * i + o * i * i for o, i in m.layer_linears)
        t["kfac_costs"] = w.candidates * (kfac / (mc.fp32_flops * MATMUL_EFF) + weights / DEQUANT_VPS)
    if w.gptq_tokens:
        moments = forward_flops(m, w.gptq_tokens, w.seq_len) + hessian_flops(m, w.gptq_tokens)
        t["gptq_moments"] = moments / (mc.bf16_flops * MATMUL_EFF)
        columns = m.layers * sum(i * max(1.0, o / 1536) for o, i in m.layer_linears)
        t["gptq"] = columns * GPTQ_COLUMN_S + m.layers * m.layer_linear_params * (1 / GRID_VPS + 2 / DEQUANT_VPS)
    return {k: round(v, 1) for k, v in t.items()}


def kquant_plan(m: Model, w: KquantWork, mc: Machine) -> Plan:
    """Memory: the F16 file is mapped by the tools, not held; --mixed holds the float32 model and the
    K-FAC statistics of a group of layers (at most 2 GiB, quantize/kquant_chooser.py STATS_BYTES). Disk: the
    F16 file, the file, and with --mixed T's own file and one file per candidate, in a folder beside it."""
    stats = min(2 << 30, 4 * m.layers * sum(o * o + i * i for o, i in m.layer_linears))
    held = m.params * 4 + stats if w.candidates else m.params * 2
    stages = {"source": m.weight_bytes, "f16_gguf": m.params * 2, "gguf": w.gguf_bytes}
    if w.candidates:
        stages["mixed_statistics"] = stats
    t = kquant_time(m, w, mc)
    disk = m.params * 2 + w.gguf_bytes * (2 + w.candidates if w.candidates else 1)
    plan = Plan(
        "export",
        model_dict(m),
        asdict(mc),
        stages,
        int(BASE_RSS["convert"] + held),
        None,
        disk,
        False,
        sum(t.values()),
        t,
    )
    check_fit(plan, mc)
    return plan
