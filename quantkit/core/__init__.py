"""Foundations every layer uses: atomic writes, file hashes, the roofline's pure math, datasheet figures, torchrun."""
