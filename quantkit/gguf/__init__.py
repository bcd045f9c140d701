"""GGUF export for llama.cpp: exact where the artifact's integer grid is one of ggml's.

grids (pure block math) · codes (the integer codes in ggml's blocks) · artifact (reading an
artifact's codes and scales) · artifact_provenance (what an artifact's quantkit.json says of it) ·
gguf_arch (architectures as data) · vocab (tokenizer keys) · tensor_map (what each tensor becomes) ·
tensors (bytes + checks) · write (the file, transactionally) · read (opening a GGUF safely) ·
fidelity (KL through transformers) · target (where the GGUF and its record go, and reading that
record) · gguf_records (the record beside a GGUF: `GgufRecord`, `KquantRecord`) · artifact_to_gguf
(the exact export: `export_gguf`, `GgufOptions`) · llama_quantize (llama.cpp's own types:
`export_kquant`) · type_report (what each tensor of a GGUF got, read back) · tools, cpu_variant,
cpu_probe, trial, gguf_twin (llama.cpp's programs, which of its CPU builds runs here, a GGUF's
first run in a child, its small twin).

Nothing is imported here: a reader of GGUF files (evals, bench) imports gguf.read alone.
"""
