"""`export --type T --mixed`'s rounding: GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers") inside llama.cpp's own blocks.

llama-quantize rounds each weight to its block's grid on its own, choosing the block's scales with
the importance matrix (the inputs' mean squares: a diagonal of X Xᵀ). Here, once the types are
chosen and llama-quantize has written them, every decoder-layer weight's codes are chosen again
column by column, each column's rounding error carried into the columns not yet rounded through the
inverse of its inputs' second moment H = X Xᵀ (the full matrix, over the calibration windows the
importance matrix is made from), so that ‖(Ŵ − W) X‖² is small rather than each |ŵ − w|. The
blocks' scales stay those llama-quantize chose (gguf/codes.py rewrites the code bits only): the
file keeps its types, its layout and its size, and llama.cpp reads it as it read the other.

Columns are taken by decreasing H diagonal (static act-order: the scales are fixed beforehand, so
the order changes nothing in the file's layout), H is damped by 1% of its mean diagonal, and a
column no input reaches is left as llama-quantize rounded it. The proxy error ‖(Ŵ − W) X‖² of
llama-quantize's codes and of GPTQ's are both recorded per weight.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from quantkit.gguf import codes
from quantkit.gguf.read import open_reader
from quantkit.progress import note

DAMP = 0.01  # of the mean diagonal (GPTQ's default, as llm-compressor's dampening_frac)
BLOCK = 128  # columns updated lazily per block (GPTQ's B)


def gptq_codes(w, h, scale, offset, levels, damp: float = DAMP, block: int = BLOCK) -> torch.Tensor:
    """Codes (out, in) on a fixed grid (code c of value (i, j) stands for scale[i, j]·levels[c] + offset[i, j])
    that GPTQ picks for W (out, in) given H (in, in) = Σ x xᵀ of its inputs. On one thread: the column
    loop's small operations ran 10x slower on two threads of a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _gptq(w, h, scale, offset, levels, damp, block)
    finally:
        torch.set_num_threads(threads)


def _gptq(w, h, scale, offset, levels, damp: float, block: int) -> torch.Tensor:
    w = w.detach().to(torch.float64)
    h = h.detach().to(torch.float64).clone()
    n = w.shape[1]
    dead = torch.diagonal(h) <= 0
    h[dead, dead] = 1.0
    perm = torch.argsort(torch.diagonal(h), descending=True)
    # columns as rows (in, out): each column's update below touches contiguous memory
    wt = w.T[perm].contiguous()
    st, ot = scale.T.to(torch.float64)[perm].contiguous(), offset.T.to(torch.float64)[perm].contiguous()
    h = h[perm][:, perm]
    h += damp * torch.diagonal(h).mean() * torch.eye(n, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    rnd = _rounder(levels)
    q = torch.empty(wt.shape, dtype=torch.int64)
    for i1 in range(0, n, block):
        i2 = min(i1 + block, n)
        w1, err = wt[i1:i2].clone(), torch.empty(i2 - i1, wt.shape[1], dtype=torch.float64)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            code, value = rnd(w1[i], st[i1 + i], ot[i1 + i])
            q[i1 + i] = code
            e = (w1[i] - value) / u1[i, i]
            w1[i:].addr_(u1[i, i:], e, alpha=-1)
            err[i] = e
        wt[i2:] -= u[i1:i2, i2:].T @ err
    out = torch.empty_like(q)
    out[perm] = q
    return out.T.contiguous()


def _rounder(levels):
    """(x, scale, offset) -> (code, value) of the grid point nearest each x: uniform levels by
    rounding, others (IQ4's) by search among the sorted levels; a zero scale takes the level nearest 0."""
    lv = torch.as_tensor(np.asarray(levels), dtype=torch.float64)
    order = torch.argsort(lv)
    lv_sorted = lv[order]
    steps = lv_sorted[1:] - lv_sorted[:-1]
    zero = int(torch.argmin(lv_sorted.abs()))
    if bool((steps == steps[0]).all()):
        first, step, top = float(lv_sorted[0]), float(steps[0]), len(lv) - 1

        def uniform(x, scale, offset):
            safe = torch.where(scale == 0, torch.ones_like(scale), scale)
            idx = torch.clamp(torch.round(((x - offset) / safe - first) / step), 0, top).long()
            idx = torch.where(scale == 0, zero, idx)
            return order[idx], scale * lv_sorted[idx] + offset

        return uniform

    def search(x, scale, offset):
        idx = _nearest(x, scale, offset, lv_sorted)
        return order[idx], scale * lv_sorted[idx] + offset

    return search


def _nearest(x, scale, offset, lv_sorted) -> torch.Tensor:
    """Index into the sorted levels of the grid point nearest each x (a zero scale: the level nearest 0)."""
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    t = (x - offset) / safe
    i = torch.clamp(torch.searchsorted(lv_sorted, t), 1, len(lv_sorted) - 1)
    lo, hi = lv_sorted[i - 1], lv_sorted[i]
    pick = torch.where((t - lo).abs() <= (hi - t).abs(), i - 1, i)
    return torch.where(scale == 0, torch.argmin(lv_sorted.abs()), pick)


def proxy_error(dw, h) -> float:
    """‖ΔW X‖² = tr(ΔW H ΔWᵀ) for H = Σ x xᵀ (per token when H is)."""
    dw = dw.to(torch.float64)
    return float(((dw @ h.to(torch.float64)) * dw).sum())


def refine(path, weights: dict, f16: dict, hessians: dict, input_of) -> dict:
    """Rewrite the codes of the decoder-layer weights of the GGUF at `path` with GPTQ; `weights`:
    tensor name -> its record (source, row length), `f16`: tensor name -> its 16-bit values in the
    file's row order (out, in), `hessians`: input name -> H, `input_of(name)` the input a weight reads.
    Returns {tensor: {type, proxy_before, proxy_after}}."""
    reader = open_reader(path)
    tensors = {t.name: t for t in reader.tensors if t.name in weights}
    out = {}
    t0 = time.perf_counter()
    with open(path, "r+b") as fh:
        for k, (name, t) in enumerate(tensors.items()):
            lay = codes.LAYOUTS.get(t.tensor_type.name)
            if lay is None:  # a type with no code layout here (F16 kept by the choice): left as it is
                continue
            blocks = codes.blocks_of(np.array(t.data), lay)
            w = f16[name].to(torch.float64)
            rows, cols = w.shape
            s, o = codes.grid(blocks, lay)
            scale = torch.from_numpy(s.reshape(rows, cols))
            offset = torch.from_numpy(o.reshape(rows, cols))
            h = hessians[input_of(name)]
            before = scale * torch.from_numpy(lay.levels[codes.codes(blocks, lay)].reshape(rows, cols)) + offset
            q = gptq_codes(w, h, scale, offset, lay.levels)
            after = scale * torch.from_numpy(lay.levels[q.numpy()]) + offset
            new = codes.with_codes(blocks, lay, q.numpy().reshape(-1, lay.block))
            fh.seek(int(t.data_offset))
            fh.write(new.tobytes())
            out[name] = {
                "type": lay.qtype,
                "proxy_before": proxy_error(before - w, h),
                "proxy_after": proxy_error(after - w, h),
            }
            if k % 20 == 19:
                note(f"export --mixed: GPTQ codes of {k + 1}/{len(tensors)} weights ({time.perf_counter() - t0:.0f} s)")
    return out
