"""GGUF export for llama.cpp: exact where the artifact's integer grid is one of ggml's.

grids (pure block math) · source (reading an artifact's codes and scales) · arch (architectures
as data) · vocab (tokenizer keys) · plan (what each tensor becomes) · tensors (bytes + checks) ·
write (the file, transactionally) · read (opening a GGUF safely) · fidelity (KL through
transformers) · target (where the GGUF and its record go) · exporter (the whole export:
`export_gguf`, `GgufOptions`).

Nothing is imported here: a reader of GGUF files (evals, bench) imports gguf.read alone.
"""
