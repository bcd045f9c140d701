"""Exporters: an artifact written in a serving format (export/exporter.py), by name (export/export_registry.py)."""
