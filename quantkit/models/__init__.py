"""Checkpoints: finding, checking and loading them, the demo model, disk offloading, sizes from headers."""
