"""Text sources, calibration sets and mixes."""
