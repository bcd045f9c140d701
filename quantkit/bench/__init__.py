"""Batch-1 TTFT/TPOT measurement: engines, low-bit kernels, the device probe, the rule check."""
