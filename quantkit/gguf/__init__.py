"""GGUF export for llama.cpp: exact where the artifact's integer grid is one of ggml's.

grids (pure block math) · source (reading an artifact's codes and scales) · arch (architectures
as data) · vocab (tokenizer keys) · plan (what each tensor becomes) · tensors (bytes + checks) ·
write (the file, transactionally) · read (opening a GGUF safely) · fidelity (KL through
transformers) · exporter (the whole export).
"""

from quantkit.gguf.exporter import GgufOptions, default_out, export_gguf, record_path

__all__ = ["GgufOptions", "default_out", "export_gguf", "record_path"]
