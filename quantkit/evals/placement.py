"""Where an evaluation runs: its device, the precision it loads models in, windows per forward pass.

float32 on the CPU: every CPU computes it natively (bf16 is emulated on those without bf16
arithmetic, an order of magnitude slower there), and bf16's rounding would add to the deltas being
measured. On a GPU, bfloat16 (what users serve there, half the memory of float32) where the
device's probe shows bf16 arithmetic at least as fast as float32's (core/precision.py), else float32.
"""

from __future__ import annotations

from quantkit.core.precision import choose
from quantkit.device import free_bytes

# The share of the device's free memory (after the model is loaded) a batch of windows may take.
BATCH_MEMORY_SHARE = 0.4
MAX_BATCH = {"cuda": 32, "cpu": 1}


def default_dtype(device, rates: dict | None = None) -> str:
    """float32 on the CPU; elsewhere the probe's choice from its matmul `rates` (dtype -> TFLOP/s)."""
    return "float32" if device.type == "cpu" else choose(rates).dtype


def window_bytes(config: dict, seq_len: int, dtype: str) -> int:
    """Peak bytes one window adds to a forward pass without a KV cache: its logits in the model's
    dtype, one float32 copy and its log-softmax (the scorer upcasts one window at a time, so those
    two count once per batch, folded in here as a bound), and a layer's activations (hidden states,
    residual, MLP intermediate, attention scores where the kernel materializes them)."""
    elem = 4 if dtype == "float32" else 2
    vocab = int(config.get("vocab_size") or 0)
    hidden = int(config.get("hidden_size") or 0)
    inter = int(config.get("intermediate_size") or 4 * hidden)
    heads = int(config.get("num_attention_heads") or 1)
    per_token = vocab * (elem + 8) + (6 * hidden + 3 * inter) * elem + heads * seq_len * 4
    return seq_len * per_token


def default_batch_size(device, config: dict, seq_len: int, n_windows: int, dtype: str) -> int:
    """Windows per forward pass: on a GPU as many as fit BATCH_MEMORY_SHARE of its free memory (up
    to MAX_BATCH); on the CPU one, as batching a compute-bound CPU forward gains nothing measurable
    (README, eval section) while it multiplies the peak memory."""

    cap = MAX_BATCH.get(device.type, 1)
    if cap <= 1:
        return 1
    fit = int(free_bytes(device) * BATCH_MEMORY_SHARE // max(1, window_bytes(config, seq_len, dtype)))
    return max(1, min(cap, fit, max(1, n_windows)))
