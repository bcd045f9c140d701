"""Conversion: preflight checks, the convert job, the reload check, per-unit sensitivity."""
