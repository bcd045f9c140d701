"""A persistent ggml threadpool for a llama-cpp-python context, as llama.cpp's own programs use.

llama-bench, llama-server and llama-cli create one threadpool per context (ggml_threadpool_new,
hybrid polling at level 50 between graph nodes) and attach it (llama_attach_threadpool).
llama-cpp-python 0.3 binds neither call (its llama_cpp.py: "TODO: Add llama_attach_threadpool"),
so ggml makes a disposable threadpool for every graph it computes. In a build with OpenMP (the
default on Linux, and the install's) every graph runs on OpenMP's own thread team either way and
the pool holds the barrier state and the polling level; in a build without it the workers are
pthreads, started and joined for each decoded token. quantkit's llama.cpp rows are to time what
llama.cpp's own tools run, so this binds the two calls through ctypes and nothing more: the CPU backend's
registry gives ggml_threadpool_new/free (as llama-bench gets them: llama-bench.cpp), libllama
the attach. Where a symbol is missing (another llama.cpp), `attach` returns None and the context
keeps ggml's per-graph pool; the engine's description says which one ran.
"""

from __future__ import annotations

import ctypes

GGML_MAX_N_THREADS = 512  # ggml.h


class _Params(ctypes.Structure):
    """struct ggml_threadpool_params (ggml.h)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


class Threadpool:
    """One attached threadpool: `detach` it before the context is freed, `free` it after."""

    def __init__(self, lib, ctx, pool: int, free, threads: int, poll: int):
        self._lib, self._ctx, self._pool, self._free = lib, ctx, pool, free
        self.threads, self.poll = threads, poll

    def detach(self) -> None:
        """Before llama_free: the context stops using the pool."""
        if self._ctx is not None:
            self._lib.llama_detach_threadpool(self._ctx)
            self._ctx = None

    def free(self) -> None:
        """After `detach` and after the context is freed (never touching it): the pool's threads stop."""
        if self._pool:
            self._free(self._pool)
            self._pool = None


def attach(llama_cpp, ctx, threads: int) -> Threadpool | None:
    """A threadpool of `threads` threads with ggml's default parameters (ggml_threadpool_params_init:
    poll 50, the inherited affinity), attached to `ctx` for decoding and prompts alike, as
    llama-bench attaches its own; None where this llama.cpp lacks a symbol for it."""
    lib = llama_cpp.llama_cpp._lib  # libllama as llama-cpp-python loaded it; dlsym reaches libggml through it
    try:
        reg_by_name, proc, init = (
            lib.ggml_backend_reg_by_name,
            lib.ggml_backend_reg_get_proc_address,
            lib.ggml_threadpool_params_init,
        )
        attach_fn, detach_fn = lib.llama_attach_threadpool, lib.llama_detach_threadpool
    except AttributeError:
        return None
    reg_by_name.restype, reg_by_name.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    proc.restype, proc.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    init.restype, init.argtypes = None, [ctypes.POINTER(_Params), ctypes.c_int]
    attach_fn.restype, attach_fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    detach_fn.restype, detach_fn.argtypes = None, [ctypes.c_void_p]
    reg = reg_by_name(b"CPU")
    new_addr, free_addr = (
        (proc(reg, b"ggml_threadpool_new"), proc(reg, b"ggml_threadpool_free")) if reg else (None, None)
    )
    if not new_addr or not free_addr:
        return None
    new = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_Params))(new_addr)
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(free_addr)
    params = _Params()
    init(ctypes.byref(params), threads)
    pool = new(ctypes.byref(params))
    if not pool:
        return None
    attach_fn(ctx, pool, None)  # NULL: prompts use the same pool (llama_context::attach_threadpool)
    return Threadpool(lib, ctx, pool, free, params.n_threads, params.poll)
