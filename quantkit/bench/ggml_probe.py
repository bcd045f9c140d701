"""ggml's own kernels timed on a GGUF's own weights: the weights' share of a llama.cpp decode step.

Each tensor type of the file becomes one ggml graph of `mul_mat(W, x)` over every 2-D weight of
that type, x one F32 row as in a decode step (ggml converts it to the type's dot-product format,
as llama.cpp's graph does), plus the embedding's one-row `get_rows`. The graph runs on the
backend llama.cpp itself runs (the CPU variant the process loaded, at the bench's threads; a GPU
backend for `--device cuda`) through ggml's public C API (ggml.h, ggml-backend.h, ggml-alloc.h of
the llama.cpp that llama-cpp-python vendors), bound with ctypes the way llama-cpp-python binds
llama.h.

Each weight goes where llama.cpp's loader puts it (llama-model-loader.cpp, select_weight_buft):
the first of the CPU's extra buffer types whose `supports_op` takes the product (the repacked
layouts that interleave Q4_0, Q4_K, IQ4_NL... rows for a faster kernel), else the device's own
buffer. Weights in the plain CPU buffer are not copied: the file's mapped pages are their memory
(ggml_backend_dev_buffer_from_host_ptr, as llama.cpp's mmap); the others are copied (repacked on
the way, by the buffer type itself), at most MAX_COPY_BYTES per group, the time scaled to all.
"""

from __future__ import annotations

import ctypes

import numpy as np

from quantkit.bench.weight_timing import interleaved_passes
from quantkit.core.attribution import KernelTime
from quantkit.errors import QuantkitError
from quantkit.gguf.read import open_reader

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26  # ggml.h enum ggml_type
DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # ggml-backend.h enum ggml_backend_dev_type: CPU, GPU
TENSOR_BUFFER_OFFSET = 8  # ggml.h struct ggml_tensor: `enum ggml_type type; struct ggml_backend_buffer * buffer;`
PROBE_ROWS = 512  # the batch llama.cpp's loader asks supports_op about (weight_buft_supported)
MAX_COPY_BYTES = 2 << 30  # per group of copied weights (a GPU's, or a repacked CPU layout's)
EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"
_p = ctypes.c_void_p


class _InitParams(ctypes.Structure):
    """struct ggml_init_params (ggml.h)."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _p), ("no_alloc", ctypes.c_bool)]


# name -> (restype, argtypes) of each call used
_SIGNATURES = {
    "ggml_init": (_p, [_InitParams]),
    "ggml_free": (None, [_p]),
    "ggml_tensor_overhead": (ctypes.c_size_t, []),
    "ggml_graph_overhead_custom": (ctypes.c_size_t, [ctypes.c_size_t, ctypes.c_bool]),
    "ggml_new_tensor_1d": (_p, [_p, ctypes.c_int, ctypes.c_int64]),
    "ggml_new_tensor_2d": (_p, [_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
    "ggml_mul_mat": (_p, [_p, _p, _p]),
    "ggml_get_rows": (_p, [_p, _p, _p]),
    "ggml_new_graph_custom": (_p, [_p, ctypes.c_size_t, ctypes.c_bool]),
    "ggml_build_forward_expand": (None, [_p, _p]),
    "ggml_nbytes": (ctypes.c_size_t, [_p]),
    "ggml_backend_init_by_type": (_p, [ctypes.c_int, ctypes.c_char_p]),
    "ggml_backend_free": (None, [_p]),
    "ggml_backend_get_device": (_p, [_p]),
    "ggml_backend_dev_backend_reg": (_p, [_p]),
    "ggml_backend_dev_by_type": (_p, [ctypes.c_int]),
    "ggml_backend_dev_buffer_type": (_p, [_p]),
    "ggml_backend_dev_supports_op": (ctypes.c_bool, [_p, _p]),
    "ggml_backend_dev_buffer_from_host_ptr": (_p, [_p, _p, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_backend_reg_get_proc_address": (_p, [_p, ctypes.c_char_p]),
    "ggml_backend_buft_alloc_buffer": (_p, [_p, ctypes.c_size_t]),
    "ggml_backend_buft_name": (ctypes.c_char_p, [_p]),
    "ggml_backend_alloc_ctx_tensors": (_p, [_p, _p]),
    "ggml_backend_alloc_ctx_tensors_from_buft": (_p, [_p, _p]),
    "ggml_backend_buffer_free": (None, [_p]),
    "ggml_backend_tensor_set": (None, [_p, _p, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_backend_tensor_alloc": (ctypes.c_int, [_p, _p, _p]),
    "ggml_backend_graph_compute": (ctypes.c_int, [_p, _p]),
    "ggml_backend_synchronize": (None, [_p]),
}


class Ggml:
    """The ggml calls the probe makes, bound on a loaded library (libllama reaches libggml's symbols)."""

    def __init__(self, lib):
        for name, (res, args) in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise QuantkitError(f"this llama.cpp's library has no {name}: ggml's kernels cannot be timed") from None
            fn.restype, fn.argtypes = res, args
            setattr(self, name.removeprefix("ggml_"), fn)

    def proc(self, dev, name: bytes, ftype):
        reg = self.backend_dev_backend_reg(dev)
        addr = self.backend_reg_get_proc_address(reg, name) if reg else None
        return ftype(addr) if addr else None


class Backend:
    """The backend of one device as llama.cpp runs it, and the buffer types its weights may take."""

    def __init__(self, g: Ggml, device, threads: int):
        kind = DEVICE_TYPES.get(device.type)
        self.g, self.cpu = g, device.type == "cpu"
        self.ptr = g.backend_init_by_type(kind, None) if kind is not None else None
        if not self.ptr:
            raise QuantkitError(f"ggml has no {device.type} backend in this build")
        self.dev = g.backend_get_device(self.ptr)
        set_threads = g.proc(self.dev, b"ggml_backend_set_n_threads", ctypes.CFUNCTYPE(None, _p, ctypes.c_int))
        if set_threads:
            set_threads(self.ptr, threads)
        self.bufts = [*self._extra_bufts(), (self.dev, g.backend_dev_buffer_type(self.dev))]

    def _extra_bufts(self) -> list:
        """The CPU's extra buffer types (llama-model.cpp make_cpu_buft_list), tried before the device's own."""
        cpu = self.g.backend_dev_by_type(DEVICE_TYPES["cpu"])
        get = self.g.proc(cpu, b"ggml_backend_dev_get_extra_bufts", ctypes.CFUNCTYPE(ctypes.POINTER(_p), _p))
        if not get or not self.cpu:  # on a GPU the weights stay in its own buffer (the engine offloads all)
            return []
        arr, out, i = get(cpu), [], 0
        while arr and arr[i]:
            out.append((cpu, arr[i]))
            i += 1
        return out

    def placement(self, w, op) -> tuple:
        """The first (device, buffer type) whose supports_op takes `op` with `w` in it."""
        slot = ctypes.c_void_p.from_address(w + TENSOR_BUFFER_OFFSET)
        for dev, buft in self.bufts:
            dummy = self.g.backend_buft_alloc_buffer(buft, 0)
            slot.value = dummy
            try:
                ok = self.g.backend_dev_supports_op(dev, op)
            finally:
                slot.value = None
                self.g.backend_buffer_free(dummy)
            if ok:
                return dev, buft
        raise QuantkitError("no ggml buffer type takes a weight of this model")

    def sync(self) -> None:
        self.g.backend_synchronize(self.ptr)

    def close(self) -> None:
        self.g.backend_free(self.ptr)


def matvec_items(reader) -> list[tuple[str, str, int, int, object]]:
    """(name, op, ne0, ne1, tensor) of each product a decode step makes with a weight: every 2-D
    weight times a row, the embedding one row (`get_rows`), and with no output.weight (tied) the
    embedding times a row as the lm_head."""
    items = []
    names = {t.name for t in reader.tensors}
    for t in reader.tensors:
        shape = [int(x) for x in t.shape.tolist()]
        if len(shape) != 2:
            continue
        ops = ["mul_mat"]
        if t.name == EMBEDDING:
            ops = ["get_rows"] + (["mul_mat"] if OUTPUT not in names else [])
        items += [(t.name, op, shape[0], shape[1], t) for op in ops]
    return items


def _bytes(op: str, t, ne1: int) -> int:
    return int(t.n_bytes) // ne1 if op == "get_rows" else int(t.n_bytes)


def _groups(g: Ggml, be: Backend, items: list) -> dict[tuple[str, str], list]:
    """Items by (tensor type, buffer type name), each weight placed as llama.cpp's loader places it."""
    ctx = g.init(_InitParams(g.tensor_overhead() * 8, None, True))
    out: dict[tuple[str, str], list] = {}
    try:
        for item in items:
            name, op, ne0, ne1, t = item
            w = g.new_tensor_2d(ctx, int(t.tensor_type), ne0, ne1)
            if op == "get_rows":
                probe = g.get_rows(ctx, w, g.new_tensor_1d(ctx, GGML_TYPE_I32, PROBE_ROWS))
            else:
                probe = g.mul_mat(ctx, w, g.new_tensor_2d(ctx, GGML_TYPE_F32, ne0, PROBE_ROWS))
            _, buft = be.placement(w, probe)
            out.setdefault((t.tensor_type.name, buft), []).append(item)
            g.free(ctx)
            ctx = g.init(_InitParams(g.tensor_overhead() * 8, None, True))
    finally:
        g.free(ctx)
    return out


def time_gguf_weights(path, device, threads: int, llama_lib) -> tuple[KernelTime, ...]:
    """Each (tensor type, buffer type)'s products of one decode step, timed on ggml's backend: every
    group's graph in turn, pass after pass, so each is timed with the others' bytes streamed between
    its passes as in a decode step (bench/weight_timing.interleaved_passes)."""
    reader = open_reader(path)
    g = Ggml(llama_lib)
    be = Backend(g, device, threads)
    base, size = reader.data.ctypes.data, int(reader.data.nbytes)
    mapped = g.backend_dev_buffer_from_host_ptr(be.dev, base, size, size) if be.cpu else None
    plain = be.bufts[-1][1]
    groups: list[Group] = []
    try:
        for (qtype, buft), items in _groups(g, be, matvec_items(reader)).items():
            host = mapped if buft == plain and mapped else None
            label = qtype if buft == plain else f"{qtype} ({g.backend_buft_name(buft).decode()})"
            groups.append(Group(g, be, label, items, base, buft, host))
        times = interleaved_passes([gr.run for gr in groups], [gr.label for gr in groups], be.sync)
        return tuple(KernelTime(gr.label, gr.bytes, gr.flops, times[gr.label] * gr.scale) for gr in groups)
    finally:
        for gr in groups:
            gr.free()
        if mapped:
            g.backend_buffer_free(mapped)
        be.close()


def _kept(items: list) -> tuple[list, float]:
    """The items copied (at most MAX_COPY_BYTES, at least one) and the factor that scales their time to all."""
    total = sum(_bytes(op, t, ne1) for _, op, _, ne1, t in items)
    kept, acc = [], 0
    for it in items:
        b = _bytes(it[1], it[4], it[3])
        if kept and acc + b > MAX_COPY_BYTES:
            break
        kept.append(it)
        acc += b
    return kept, total / acc


class Group:
    """One (tensor type, buffer type)'s products as a ggml graph, its weights placed, ready to run."""

    def __init__(self, g: Ggml, be: Backend, label: str, items: list, base: int, buft, host):
        self.g, self.be, self.label = g, be, label
        self.bytes = float(sum(_bytes(op, t, ne1) for _, op, _, ne1, t in items))
        self.flops = float(sum(2.0 * ne0 * (1 if op == "get_rows" else ne1) for _, op, ne0, ne1, _ in items))
        self.scale = 1.0
        if host is None:
            items, self.scale = _kept(items)
        n = len(items)
        mem = g.tensor_overhead() * (4 * n + 8) + g.graph_overhead_custom(4 * n + 8, False)
        self.ctx_w, self.ctx_c = g.init(_InitParams(mem, None, True)), g.init(_InitParams(mem, None, True))
        self.buffers: list = []
        try:
            self._build(items, base, buft, host)
        except BaseException:
            self.free()
            raise

    def _build(self, items: list, base: int, buft, host) -> None:
        g, be = self.g, self.be
        weights, ys, xs, rows = {}, [], {}, []
        for name, op, ne0, ne1, t in items:
            if name not in weights:
                weights[name] = (g.new_tensor_2d(self.ctx_w, int(t.tensor_type), ne0, ne1), t)
            w = weights[name][0]
            if op == "get_rows":
                rows.append(g.new_tensor_1d(self.ctx_c, GGML_TYPE_I32, 1))
                ys.append(g.get_rows(self.ctx_c, w, rows[-1]))
            else:
                xs.setdefault(ne0, g.new_tensor_2d(self.ctx_c, GGML_TYPE_F32, ne0, 1))
                ys.append(g.mul_mat(self.ctx_c, w, xs[ne0]))
        self.graph = g.new_graph_custom(self.ctx_c, 4 * len(items) + 8, False)
        for y in ys:
            g.build_forward_expand(self.graph, y)
        if host is not None:  # the file's own pages
            for w, t in weights.values():
                if g.backend_tensor_alloc(host, w, base + int(t.data_offset)) != 0:
                    raise QuantkitError(f"ggml could not place tensor {t.name} in the mapped file")
        else:  # copied into the buffer type (which repacks where it is a repacking one)
            self.buffers.append(g.backend_alloc_ctx_tensors_from_buft(self.ctx_w, buft))
            for w, t in weights.values():
                data = np.ascontiguousarray(t.data)
                g.backend_tensor_set(w, data.ctypes.data, 0, g.nbytes(w))
        self.buffers.append(g.backend_alloc_ctx_tensors(self.ctx_c, be.ptr))
        rng = np.random.default_rng(0)
        zero = np.zeros(1, np.int32)
        for idx in rows:
            g.backend_tensor_set(idx, zero.ctypes.data, 0, zero.nbytes)
        for ne0, x in xs.items():
            v = rng.standard_normal(ne0, dtype=np.float32)
            g.backend_tensor_set(x, v.ctypes.data, 0, v.nbytes)

    def run(self) -> None:
        if self.g.backend_graph_compute(self.be.ptr, self.graph) != 0:
            raise QuantkitError(f"ggml failed to compute the {self.label} probe graph")

    def free(self) -> None:
        for b in self.buffers:
            if b:
                self.g.backend_buffer_free(b)
        self.buffers = []
        self.g.free(self.ctx_c)
        self.g.free(self.ctx_w)
