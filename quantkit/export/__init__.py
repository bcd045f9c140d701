"""Exporters: an artifact written in a serving format (export/base.py), by name (export/registry.py)."""
