"""The llama.cpp engine (llama-cpp-python): what a CPU user who serves with llama.cpp gets.

Sources: a GGUF file, or a quantkit artifact / 16-bit checkpoint, exported exactly to GGUF first
(quantkit.gguf, cached in QUANTKIT_HOME/gguf by content hash: bench/gguf_file.py).

The timed calls are llama-cpp-python's own: `Llama.eval(ids)` for the prefill and
`Llama.eval([token])` per decode step, each followed by the argmax of the last logits
(`llama_get_logits`), which is all a greedy loop over llama-cpp-python does; so quantkit's
figures are those of a bare loop (benchmarks/llamacpp_overhead.py measures that they agree).
Settings are llama-cpp-python's defaults (f16 KV cache, flash attention off, n_batch 512)
except flash attention where --flash-attn asks (EngineSettings.flash_attn), the K and V cache
types where --kv-cache asks (EngineSettings.kv_cache: llama-cpp-python's type_k/type_v; flash
attention is then on unless asked off, which a quantized V cache refuses: core/kv_cache.py) and the threads: every
core this process may run on (os.sched_getaffinity), for the prompt and for decoding, unless
--threads says otherwise, on one persistent threadpool as llama.cpp's own programs attach
(bench/ggml_threadpool.py). eval() returns when ggml is done: no sync.

The KV cache is sized once (n_ctx = the longest sequence of the run; llama.cpp rounds it up to a
multiple of 256) and cleared by reset(); what a step reads is accounting.kv_llamacpp: llama.cpp
attends over the used cells padded to 256, not the live tokens. At --depth, rewind() drops the
decoded tail with llama_memory_seq_rm and sets llama-cpp-python's n_tokens back, as llama-cpp-python
itself does before each eval().
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import torch

from quantkit import device as devices
from quantkit.bench import accounting, ggml_threadpool, llama_bench
from quantkit.bench.engines.engine import Engine as Base
from quantkit.bench.engines.engine import EngineSettings
from quantkit.bench.ggml_probe import time_gguf_weights
from quantkit.bench.gguf_file import exported_gguf, gguf_config, is_gguf, tensor_infos, weight_read_bytes
from quantkit.core.attribution import TWIN_WIDTH
from quantkit.core.kv_cache import LLAMACPP_TYPES, LlamaCache, head_dims
from quantkit.device import resolve_device
from quantkit.errors import QuantkitError
from quantkit.gguf import cpu_variant, tools, trial
from quantkit.gguf.gguf_twin import write_twin
from quantkit.gguf.read import open_reader
from quantkit.gguf.tools import available_cores
from quantkit.home import subdir

INSTALL = "./scripts/_install.sh builds it (or: pip install llama-cpp-python)"


LIB_ENV = "LLAMA_CPP_LIB_PATH"  # llama-cpp-python loads libllama from this directory instead of its own


def import_llama_cpp():
    """llama_cpp, or one line saying how to install it.

    Where the install built llama.cpp's tools with ggml's run-time CPU dispatch from the same
    llama.cpp (tools.dispatch_library), llama-cpp-python loads their libllama: every CPU then runs
    the variant of its instruction set (the wheel is built for one level, AVX2), the one llama-bench
    and llama-server run. Whichever library it is (that one, LLAMA_CPP_LIB_PATH's, or the wheel's),
    it is first tried on this CPU in a child process (gguf/cpu_variant.py), so a variant that dies
    of an illegal instruction is never loaded here."""
    if "llama_cpp" not in sys.modules:
        if importlib.util.find_spec("llama_cpp") is None:
            raise QuantkitError(f"--engine llamacpp: llama-cpp-python is not installed; {INSTALL}")
        lib = _library_dir()
        if lib is None and cpu_variant.wheel_dir() is None:  # the Python package alone, built to run the tools'
            raise QuantkitError(
                "--engine llamacpp: llama-cpp-python was installed without a library of its own, to run llama.cpp's "
                f"tools build, which is not there any more; {INSTALL}"
            )
        where, _ = cpu_variant.runnable_dir(lib)
        if where is not None:  # read once, when llama_cpp is first imported: the process's only libllama
            os.environ[LIB_ENV] = str(where)
    try:
        import llama_cpp
    except ImportError:
        raise QuantkitError(f"--engine llamacpp: llama-cpp-python is not installed; {INSTALL}") from None
    except OSError as exc:  # the package is there but its shared library does not load
        raise QuantkitError(
            f"--engine llamacpp: llama-cpp-python's library does not load ({exc}); rebuild it: {INSTALL}"
        ) from None
    _load_cpu_backends()
    return llama_cpp


def _library_dir() -> Path | None:
    """The library llama-cpp-python is to load: LLAMA_CPP_LIB_PATH where the user set it, else the
    tools' dispatch build, else None (the wheel's own)."""
    user = os.environ.get(LIB_ENV)
    return Path(user) if user else tools.dispatch_library()


def cpu_choice() -> cpu_variant.Choice:
    """The CPU variant the library runs on this machine (cpu_variant.py's verdict, kept per machine)."""
    lib = os.environ.get(LIB_ENV)
    if lib and (Path(lib) / ".complete").is_file():  # quantkit's filtered copy: the verdict is the build's
        lib = json.loads((Path(lib) / ".complete").read_text())["from"]
    return cpu_variant.choose(Path(lib) if lib else None)


def library() -> str:
    """Which libllama llama-cpp-python runs: the tools' run-time dispatch build, or its wheel's."""
    lib = os.environ.get(LIB_ENV)
    return (
        f"{lib} (ggml's run-time CPU dispatch)"
        if lib and _dispatch_dir(Path(lib))
        else (lib or "llama-cpp-python's wheel")
    )


def _dispatch_dir(lib: Path) -> bool:
    return (lib / "libggml.so").is_file() and bool(list(lib.glob("libggml-cpu-*.so")))


def _load_cpu_backends() -> None:
    """A libggml built with GGML_BACKEND_DL has no backend until one is loaded; its tools load theirs
    from their own directory, which is not the Python executable's: load them from the library's."""
    lib = os.environ.get(LIB_ENV)
    if not lib or not _dispatch_dir(Path(lib)):
        return

    ggml = ctypes.CDLL(str(Path(lib) / "libggml.so"))  # the copy libllama already loaded
    if ggml.ggml_backend_reg_count() == 0:
        ggml.ggml_backend_load_all_from_path(str(lib).encode())
    if ggml.ggml_backend_reg_count() == 0:
        raise QuantkitError(
            f"--engine llamacpp: no ggml CPU backend in {lib} loads on this CPU; rebuild the tools: {INSTALL}"
        )


def gpu_offload() -> bool:
    """Whether the installed llama.cpp was built with a GPU backend (False when it is not installed)."""
    try:
        return bool(import_llama_cpp().llama_supports_gpu_offload())
    except QuantkitError:
        return False


def check_available(device) -> None:
    """Before anything loads: llama-cpp-python importable, and a GPU only if llama.cpp can offload to one."""
    llama_cpp = import_llama_cpp()
    if device.type != "cpu" and not llama_cpp.llama_supports_gpu_offload():
        raise QuantkitError(
            f"--engine llamacpp --device {device}: this llama-cpp-python build is CPU-only (llama.cpp reports "
            "no GPU offload); use --device cpu, or install a GPU build "
            "(CMAKE_ARGS=-DGGML_CUDA=on pip install llama-cpp-python)"
        )


class Engine(Base):
    name = "llamacpp"
    compiles = False
    takes_gguf = True
    devices = ("cpu", "cuda")  # cuda: a build with GPU offload (check)
    flash_attn_lever = True  # Llama(flash_attn=...): off is llama-cpp-python's default
    kv_cache_lever = True  # Llama(type_k=..., type_v=...): f16 is llama-cpp-python's default
    anchored = True  # llama-bench beside each row
    attributes = True  # ggml's kernels on the file's weights (bench/ggml_probe.py), the GGUF's twin

    @classmethod
    def check(cls, device) -> None:
        check_available(device)

    @classmethod
    def auto_device(cls, device):
        return (
            device if device.type == "cpu" or gpu_offload() else resolve_device("cpu")
        )  # a CPU-only build: the CPU, even beside a GPU

    @classmethod
    def default_threads(cls) -> int:
        return available_cores()

    @classmethod
    def depth_advice(cls, flash_attn: bool | None) -> str:
        if flash_attn:
            return "flash attention is on: what is left is the attention's own arithmetic over every cell"
        return (
            "without flash attention llama.cpp computes K·Q, the softmax and its product with V as separate "
            "operations over every cell, in f32; --flash-attn on fuses them (--flash-attn both measures the two)"
        )  # every core this process may use, so the probe measures what they can reach

    def __init__(self, llm, gguf: Path, settings: EngineSettings, threads: int, export: dict | None):
        self.llm, self.gguf, self.settings, self.threads, self.export = llm, gguf, settings, threads, export
        self.cache = settings.kv_cache or LlamaCache()
        # None: llama-cpp-python's default, off; on for a quantized V cache (the only way llama.cpp runs one)
        self.flash_attn = bool(self.cache.flash_attn(settings.flash_attn))
        # llama.cpp's own tools decode on one persistent threadpool; llama-cpp-python would make one per token
        self.pool = ggml_threadpool.attach(import_llama_cpp(), llm.ctx, threads)
        self.cfg = gguf_config(gguf)
        self._weights = weight_read_bytes(tensor_infos(open_reader(gguf)))
        self.n_vocab = llm.n_vocab()
        self.kv_size = llm.n_ctx()  # as llama.cpp allocated it (n_ctx rounded up to 256)
        self._np, self._lc = np, import_llama_cpp()

    @classmethod
    def load(cls, source, settings: EngineSettings) -> "Engine":
        if not isinstance(source, Path):
            raise QuantkitError(
                f"{getattr(source, 'label', source)}: --engine llamacpp benches GGUF files and checkpoint "
                "directories; for a model shape, build a random-weight checkpoint with "
                "benchmarks/shaped_checkpoint.py (in the source checkout) and bench that"
            )
        if settings.tensor_parallel != 1:
            raise QuantkitError("--tensor-parallel: the llamacpp engine runs on one device")
        check_available(settings.device)
        export = None
        gguf = source
        if not is_gguf(source):
            gguf, export = exported_gguf(source)
        threads = settings.threads or available_cores()
        return cls(_open(gguf, settings, threads), gguf, settings, threads, export)

    @classmethod
    def anchor(cls, info: dict, prompt_len: int, gen_len: int, repeats: int, depth: int | None = None) -> dict:
        """llama-bench on the same GGUF, threads, lengths, depth and flash attention (bench/llama_bench.py)."""

        return llama_bench.measure(
            Path(info["gguf"]),
            prompt_len,
            gen_len,
            info["threads"],
            repeats,
            flash_attn=info["flash_attn"],
            depth=depth,
            cache=(info["kv_cache"]["k"], info["kv_cache"]["v"]),
        )

    # ---------------------------------------------------------------- the timed paths

    def prepare(self, ids: list[int]) -> list[int]:
        return [int(i) for i in ids]

    def reset(self, capacity: int) -> None:
        if capacity > self.kv_size:
            raise QuantkitError(f"llamacpp: a {capacity}-token sequence does not fit the {self.kv_size}-token context")
        self._lc.llama_memory_clear(self._lc.llama_get_memory(self.llm.ctx), True)
        self.llm.reset()  # position 0: the next eval() starts a new sequence

    def as_token(self, token_id: int) -> int:
        return int(token_id)

    def rewind(self, depth: int) -> None:
        self._lc.llama_memory_seq_rm(self._lc.llama_get_memory(self.llm.ctx), 0, depth, -1)
        self.llm.n_tokens = depth  # where llama-cpp-python's next eval() writes

    def cache_depth(self) -> int:
        """Cells of sequence 0 in llama.cpp's own cache (its highest position + 1)."""
        return int(self._lc.llama_memory_seq_pos_max(self._lc.llama_get_memory(self.llm.ctx), 0)) + 1

    def _last_logits(self):
        return self._np.ctypeslib.as_array(self._lc.llama_get_logits(self.llm.ctx), shape=(self.n_vocab,))

    def prefill(self, prompt: list[int]) -> int:
        self.llm.eval(prompt)
        return int(self._last_logits().argmax())

    def decode(self, token: int, pos: int) -> int:
        if pos != self.llm.n_tokens:
            raise RuntimeError(f"llamacpp: decode at position {pos}, but llama.cpp holds {self.llm.n_tokens} tokens")
        self.llm.eval([token])
        return int(self._last_logits().argmax())

    # ---------------------------------------------------------------- logits

    def logprobs(self, ids: list[int], prompt_len: int, capacity: int):
        """The timed paths' logits: eval of the prompt, then one eval per later token."""

        self.reset(capacity)
        self.llm.eval(self.prepare(ids[:prompt_len]))
        rows = [self._last_logits().copy()]
        for tok in ids[prompt_len:]:
            self.llm.eval([int(tok)])
            rows.append(self._last_logits().copy())
        return torch.log_softmax(torch.from_numpy(self._np.stack(rows)).float(), -1)

    def window_logprobs(self, ids: list[int]):
        """Scoring primitive (for evaluation): next-token log-probabilities after each prefix of one
        window, float32 (len(ids), vocab); row i is the distribution of token i + 1. The window is
        evaluated from an empty cache in batches of n_batch tokens with logits kept for every
        position, as llama-perplexity does."""

        llama_cpp = self._lc
        if len(ids) > self.kv_size:
            raise QuantkitError(f"llamacpp: a {len(ids)}-token window does not fit the {self.kv_size}-token context")
        self.reset(len(ids))
        n_batch = self.llm.n_batch
        batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        rows = []
        try:
            for start in range(0, len(ids), n_batch):
                chunk = [int(t) for t in ids[start : start + n_batch]]
                batch.n_tokens = len(chunk)
                for i, tok in enumerate(chunk):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, start + i, 1, True
                    batch.seq_id[i][0] = 0
                if llama_cpp.llama_decode(self.llm.ctx, batch) != 0:
                    raise RuntimeError(f"llama_decode failed on tokens {start}..{start + len(chunk)}")
                out = llama_cpp.llama_get_logits(self.llm.ctx)
                rows.append(self._np.ctypeslib.as_array(out, shape=(len(chunk), self.n_vocab)).copy())
        finally:
            llama_cpp.llama_batch_free(batch)
            self.llm.reset()
        return torch.log_softmax(torch.from_numpy(self._np.concatenate(rows)).float(), -1)

    # ---------------------------------------------------------------- accounting and description

    def weight_bytes(self) -> dict:
        return dict(self._weights)

    def _value_bytes(self, which: str) -> float:
        """Bytes per cached K or V value, from the type llama.cpp's context holds (gguf-py's block sizes)."""
        qtype = gguf.GGMLQuantizationType(int(getattr(self.llm.context_params, f"type_{which}")))
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return size / block

    def kv_bytes_per_token(self) -> float:
        c = self.cfg
        heads = c["num_hidden_layers"] * c["num_key_value_heads"]
        return heads * (c["head_dim"] * self._value_bytes("k") + c["value_head_dim"] * self._value_bytes("v"))

    def kv_cache_type(self) -> str:
        return self.cache.label

    def step_bytes(self, cached: int, capacity: int) -> float:
        return self._weights["weight_bytes_per_token"] + accounting.kv_llamacpp(
            self.kv_bytes_per_token(), cached, self.kv_size
        )

    def describe(self) -> dict:
        llama_cpp = import_llama_cpp()
        types = self._weights["weight_bytes_by_type"]
        dtype = " + ".join(f"{t}" for t, _ in sorted(types.items(), key=lambda kv: -kv[1]))
        notes = []
        if self.export:
            how = "reused from the cache" if self.export["cached"] else f"exported in {self.export['export_s']:.1f} s"
            notes.append(f"benched as the exact GGUF of the checkpoint ({how}: {self.export['gguf']})")
        return {
            "engine": self.name,
            "kind": "gguf",
            "notes": notes,
            **devices.describe(self.settings.device),
            "kernel": f"llama.cpp (ggml {'CPU' if self.settings.device.type == 'cpu' else 'GPU offload'}) "
            f"via llama-cpp-python {llama_cpp.__version__}",
            "llama_library": library(),
            "cpu_variant": cpu_choice().describe(),
            "dtype": dtype,
            "threads": self.threads,
            "threads_available": available_cores(),
            "gguf": str(self.gguf),
            "gguf_export": self.export,
            "kv_cache_type": self.cache.label,
            "kv_cache": {"k": self.cache.k, "v": self.cache.v},
            "n_ctx": self.kv_size,
            "n_batch": self.llm.n_batch,
            "flash_attn": self.flash_attn,
            "threadpool": (
                f"persistent, {self.pool.threads} threads, poll {self.pool.poll} (as llama.cpp's tools)"
                if self.pool
                else "ggml's own, made per graph (this llama.cpp lacks the threadpool calls)"
            ),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        }

    def weight_kernels(self) -> tuple:
        return time_gguf_weights(self.gguf, self.settings.device, self.threads, import_llama_cpp().llama_cpp._lib)

    def twin_source(self):
        path = write_twin(self.gguf, subdir("twins"))
        c = self.cfg
        return path, (
            f"twin GGUF: {c['num_hidden_layers']} layers, {c['num_attention_heads']}/{c['num_key_value_heads']} heads "
            f"of {c['head_dim']}, widths {TWIN_WIDTH}, random F16 weights"
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.detach()
        if self.llm is not None:
            self.llm.close()
        self.llm = None
        if self.pool is not None:
            self.pool.free()
        self.pool = None


def _open(gguf: Path, settings: EngineSettings, threads: int):
    """llama_cpp.Llama over `gguf`; llama.cpp's own load failure (an architecture or tensor type it
    does not know) becomes one line."""
    llama_cpp = import_llama_cpp()
    gpu = settings.device.type != "cpu"
    cache = settings.kv_cache or LlamaCache()
    cache.check_heads(*head_dims(gguf_config(gguf)), settings.flash_attn, f"{gguf}: --kv-cache {cache.label}")
    flash_attn = bool(cache.flash_attn(settings.flash_attn))
    types = LLAMACPP_TYPES[cache.k].ggml_id, LLAMACPP_TYPES[cache.v].ggml_id
    trial.check_runs(
        gguf, types, flash_attn, gpu, f"--kv-cache {cache.label}, flash attention {'on' if flash_attn else 'off'}"
    )
    try:
        return llama_cpp.Llama(
            model_path=str(gguf),
            n_ctx=settings.max_tokens,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=-1 if gpu else 0,
            main_gpu=(settings.device.index or 0) if gpu else 0,
            seed=settings.seed,
            logits_all=False,
            flash_attn=flash_attn,
            type_k=types[0],
            type_v=types[1],
            verbose=False,
        )
    except (ValueError, RuntimeError) as exc:
        raise QuantkitError(f"{gguf}: llama.cpp cannot load it ({str(exc).strip().splitlines()[0][:160]})") from None
