"""The child side of the CPU-variant check (cpu_variant.py): a tiny llama GGUF, and a process that
loads one llama.cpp library directory and decodes a few tokens of it.

Run as `python -m quantkit.gguf.cpu_probe score DIR` (each CPU variant's own score, as ggml's loader
reads it) or `python -m quantkit.gguf.cpu_probe run DIR MODEL.gguf`. An instruction the CPU does not
execute kills this process (SIGILL), never the caller.

The model's weights take the types whose kernels differ most between variants (ggml-cpu's AMX and
repacked paths take Q4_0, Q8_0 and the K-quants; F16 runs the converted-vector paths), with rows of
256 columns so that every kernel accepts them. Its values are zeros and constants: what is probed
is whether the instructions run, not what they compute.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np

LIB_ENV = "LLAMA_CPP_LIB_PATH"  # llama-cpp-python loads libllama from this directory
EMBD, FF, HEADS, KV_HEADS, LAYERS, CTX = 256, 512, 4, 2, 1, 256
# (name, rows, columns, type): one weight of each kernel family
WEIGHTS = (
    ("token_embd.weight", None, EMBD, "Q8_0"),
    ("blk.0.attn_q.weight", EMBD, EMBD, "Q4_0"),
    ("blk.0.attn_k.weight", EMBD // HEADS * KV_HEADS, EMBD, "Q8_0"),
    ("blk.0.attn_v.weight", EMBD // HEADS * KV_HEADS, EMBD, "Q4_K"),
    ("blk.0.attn_output.weight", EMBD, EMBD, "Q6_K"),
    ("blk.0.ffn_gate.weight", FF, EMBD, "Q5_K"),
    ("blk.0.ffn_up.weight", FF, EMBD, "IQ4_XS"),
    ("blk.0.ffn_down.weight", EMBD, FF, "Q4_1"),
    ("output.weight", None, EMBD, "F16"),
)
TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]


def write_model(path: Path) -> Path:
    """A 1-layer llama GGUF (about 1 MB) with a byte-level SentencePiece vocabulary."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(CTX)
    w.add_embedding_length(EMBD)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(EMBD // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types([2, 3, 3, *([6] * 256)])  # unknown, control x2, byte
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(EMBD, dtype=np.float32))
    for name, rows, cols, qtype in WEIGHTS:
        rows = rows or len(TOKENS)
        t = getattr(gguf.GGMLQuantizationType, qtype)
        if qtype == "F16":
            w.add_tensor(name, np.full((rows, cols), 0.01, dtype=np.float16))
            continue
        block, size = gguf.GGML_QUANT_SIZES[t]
        w.add_tensor(name, np.zeros((rows, cols // block * size), dtype=np.uint8), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _scores(lib_dir: Path) -> dict:
    """Each libggml-cpu-VARIANT.so's ggml_backend_score() (0: the CPU lacks what it was built for)."""
    ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    out = {}
    for lib in sorted(lib_dir.glob("libggml-cpu-*.so")):
        fn = getattr(ctypes.CDLL(str(lib)), "ggml_backend_score", None)
        out[lib.name.removeprefix("libggml-cpu-").removesuffix(".so")] = int(fn()) if fn is not None else None
    return out


def open_library(lib_dir: Path | None):
    """llama_cpp with the library in `lib_dir` (llama-cpp-python's own when None) and its CPU
    backends loaded: in a child process only (this one, trial.py's)."""
    if lib_dir is not None:
        os.environ[LIB_ENV] = str(lib_dir)
    import llama_cpp  # heavy and optional: only a child imports it

    if lib_dir is not None and (lib_dir / "libggml.so").is_file() and list(lib_dir.glob("libggml-cpu-*.so")):
        ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
        if ggml.ggml_backend_reg_count() == 0:
            ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
    return llama_cpp


def _run(lib_dir: Path | None, model: Path) -> dict:
    """Load the library (llama-cpp-python's own when lib_dir is None), its CPU backend, the model;
    prefill 16 tokens and decode 4 on 2 threads."""
    llama_cpp = open_library(lib_dir)
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=CTX, n_batch=32, n_threads=2, verbose=False)
    llm.eval(list(range(3, 19)))
    for tok in (20, 21, 22, 23):
        llm.eval([tok])
    return {"ok": True}


def main(argv: list[str]) -> int:
    verb, rest = argv[0], argv[1:]
    if verb == "score":
        print(json.dumps(_scores(Path(rest[0]))), flush=True)
    elif verb == "run":
        print(json.dumps(_run(Path(rest[0]) if rest[0] != "-" else None, Path(rest[1]))), flush=True)
    else:
        print(f"unknown verb {verb}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
