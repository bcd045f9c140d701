"""Where an evaluation runs: its device, the precision it loads models in, windows per forward pass.

bfloat16 on a GPU (what users serve there, half the memory of float32); float32 on the CPU, where
bf16 matmuls are emulated on most cores and its rounding would add to the deltas being measured.
"""

from __future__ import annotations

from quantkit.device import free_bytes

DTYPES = ("float32", "bfloat16", "float16")
# The share of the device's free memory (after the model is loaded) a batch of windows may take.
BATCH_MEMORY_SHARE = 0.4
MAX_BATCH = {"cuda": 32, "cpu": 1}


def default_dtype(device) -> str:
    return "float32" if device.type == "cpu" else "bfloat16"


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
