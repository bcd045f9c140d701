#!/usr/bin/env python
"""quantkit's GPTQ INT4, exported exactly to Q4_0, against llama.cpp's own Q4_0 of the same FP16
weights, at the same file size, all run by llama.cpp: mean KL against the FP16 GGUF on held-out text.

Variants (linear layers Q4_0; token_embd/output kept F16 in every file, so sizes are equal):
  llama.cpp Q4_0            llama_model_quantize of the FP16 GGUF (ggml's round-to-nearest Q4_0)
  llama.cpp Q4_0 + imatrix  the same with an importance matrix (mean squared input activation per
                            column, as llama-imatrix computes it) from the calibration samples each
                            GPTQ artifact was converted with (read from its quantkit.json)
  each --gptq ARTIFACT      `quantkit export --format gguf` (lossless; refused otherwise)

KL(FP16 || variant) per token with full logits, over non-overlapping windows of each --text's first
half (calibration draws from second halves); 95% intervals resample windows.
Usage:
  scripts/compare_llamacpp_q4.py --fp16 demo --gptq ART [--gptq ART ...] --workdir DIR \\
      [--text set:wikitext2-valid --text set:python-stdlib-code] [--json OUT]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def export(artifact: Path, out: Path) -> dict:
    from quantkit.gguf import GgufOptions, export_gguf

    return export_gguf(artifact, out, GgufOptions(force=True))


def calibration_of(artifact: Path) -> dict:
    """The calibration an artifact was converted with (its quantkit.json), to give the imatrix the same."""
    meta = json.loads((artifact / "quantkit.json").read_text())
    c, r = meta.get("calibration") or {}, (meta.get("recipe") or {}).get("calibration") or {}
    return {"source": c.get("source") or r.get("source"), "samples": c.get("samples") or r.get("samples"),
            "seq_len": c.get("seq_len") or r.get("seq_len"), "seed": c.get("seed", r.get("seed", 0)),
            "region": c.get("region") or r.get("region", "second-half")}


def imatrix(fp16: Path, calib: dict) -> dict[str, np.ndarray]:
    """Per linear layer, the mean squared input activation per column (llama-imatrix's statistic), under
    the GGUF tensor names, from the FP16 model on the calibration samples quantkit's convert draws for
    the same settings (quantkit.data.calib.build: same source, count, length, seed and region)."""
    from quantkit.data import calib as qcalib
    from quantkit.gguf.arch import hparams
    from quantkit.gguf.plan import make_plan
    from quantkit.gguf.source import Artifact
    from quantkit.models.checkpoint import checkpoint_hash, load_model, load_tokenizer

    with Artifact(fp16) as art:
        names = {p.source[: -len(".weight")]: p.name for p in make_plan(art, hparams(art.path, art.config)) if len(p.shape) == 2}
    model = load_model(fp16, dtype="float32")
    cset = qcalib.build(fp16, load_tokenizer(fp16), calib["source"], samples=calib["samples"], seq_len=calib["seq_len"],
                        seed=calib["seed"], region=calib["region"], chat_template=False, model=model, model_hash=checkpoint_hash(fp16))
    sums: dict[str, torch.Tensor] = {}

    def hook(name):
        def fn(mod, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
        return fn

    hooks = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if n in names and isinstance(m, torch.nn.Linear)]
    count = 0
    with torch.inference_mode():
        for sample in cset.samples:
            model(sample.reshape(1, -1), use_cache=False)
            count += sample.numel()
    for h in hooks:
        h.remove()
    return {names[n]: (s / count).float().numpy() for n, s in sums.items()}


def llama_quantize(f16: Path, out: Path, imat: dict[str, np.ndarray] | None = None) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.token_embedding_type = llama_cpp.GGML_TYPE_F16  # as quantkit's export keeps them
    params.output_tensor_type = llama_cpp.GGML_TYPE_F16
    params.nthread = 2
    keep = []
    if imat:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imat) + 1))()  # NULL-name terminated
        for i, (name, v) in enumerate(imat.items()):
            buf = np.ascontiguousarray(v, dtype=np.float32)
            keep += [buf, name.encode()]
            arr[i].name, arr[i].data, arr[i].size = keep[-1], buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), buf.size
        params.imatrix = arr
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")


def load(path: Path, n_ctx: int):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False, n_threads=2)


def window_logits(llm, ids: list[int]) -> torch.Tensor:
    llm.reset()
    llm.eval(ids)
    return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))


def score(files: dict[str, Path], windows: list[list[int]], n_ctx: int) -> dict:
    """Per variant and window: mean KL vs FP16, NLL of the next token, top-1 agreement."""
    base = load(files["FP16"], n_ctx)
    models = {k: load(p, n_ctx) for k, p in files.items() if k != "FP16"}
    out = {k: {"kl": [], "nll": [], "top1": []} for k in files}
    for ids in windows:
        lb = torch.log_softmax(window_logits(base, ids).double(), -1)
        nxt = torch.tensor(ids[1:])
        out["FP16"]["nll"].append(float(-lb[:-1].gather(1, nxt[:, None]).mean()))
        for k, llm in models.items():
            lm = torch.log_softmax(window_logits(llm, ids).double(), -1)
            out[k]["kl"].append(float((lb.exp() * (lb - lm)).sum(-1)[:-1].mean()))
            out[k]["nll"].append(float(-lm[:-1].gather(1, nxt[:, None]).mean()))
            out[k]["top1"].append(float((lb[:-1].argmax(-1) == lm[:-1].argmax(-1)).double().mean()))
    for llm in [base, *models.values()]:
        llm.close()
    return out


def summarize(per: dict, reference: str, n_boot: int = 2000, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = len(per["FP16"]["nll"])
    idx = rng.integers(0, n, size=(n_boot, n))
    res = {"FP16": {"ppl": float(np.exp(np.mean(per["FP16"]["nll"])))}}
    ref = np.array(per[reference]["kl"])
    for k, v in per.items():
        if k == "FP16":
            continue
        kl = np.array(v["kl"])
        red = 1.0 - kl[idx].mean(1) / ref[idx].mean(1)  # paired: the same windows for both
        res[k] = {"kl_mean": float(kl.mean()), "kl_ci95": [float(np.percentile(kl[idx].mean(1), q)) for q in (2.5, 97.5)],
                  "ppl": float(np.exp(np.mean(v["nll"]))), "top1": float(np.mean(v["top1"])),
                  f"kl_reduction_vs_{reference}": float(1.0 - kl.mean() / ref.mean()),
                  "reduction_ci95": [float(np.percentile(red, q)) for q in (2.5, 97.5)]}
    return res


def main() -> None:
    from quantkit.evals.perplexity import text_windows
    from quantkit.models.checkpoint import load_tokenizer, resolve_model
    from quantkit.data.text import parse_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp16", default="demo")
    ap.add_argument("--gptq", action="append", type=Path, required=True)
    ap.add_argument("--text", action="append", default=None)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    texts = a.text or ["set:wikitext2-valid", "set:python-stdlib-code"]
    t0 = time.perf_counter()
    a.workdir.mkdir(parents=True, exist_ok=True)
    fp16 = resolve_model(a.fp16)
    files = {"FP16": a.workdir / "fp16.gguf"}
    export(fp16, files["FP16"])
    files["llama.cpp Q4_0"] = a.workdir / "llamacpp-q4_0.gguf"
    llama_quantize(files["FP16"], files["llama.cpp Q4_0"])
    calibs = {}
    for art in a.gptq:
        c = calibration_of(art)
        calibs.setdefault(json.dumps(c, sort_keys=True), c)
    ref_imatrix = None
    for i, c in enumerate(calibs.values()):
        name = f"llama.cpp Q4_0 + imatrix ({c['source']}, {c['samples']} x {c['seq_len']})"
        files[name] = a.workdir / f"llamacpp-q4_0-imatrix-{i}.gguf"
        llama_quantize(files["FP16"], files[name], imatrix(fp16, c))
        ref_imatrix = ref_imatrix or name
    for art in a.gptq:
        rec = export(art, a.workdir / f"{art.name}.gguf")
        assert rec["lossless"], f"{art}: export not lossless"
        c = calibration_of(art)
        files[f"quantkit {art.name} ({c['source']}, {c['samples']} x {c['seq_len']}) -> Q4_0"] = a.workdir / f"{art.name}.gguf"
    tok = load_tokenizer(fp16)
    result = {"files": {k: {"path": str(p), "bytes": p.stat().st_size} for k, p in files.items()}, "domains": {},
              "calibrations": list(calibs.values())}
    for spec in texts:
        win = text_windows(tok, parse_spec(spec), seq_len=a.seq_len, max_tokens=a.max_tokens, region="first-half")
        per = score(files, [w.tolist() for w in win.tokens], a.seq_len + 8)
        result["domains"][spec] = {"windows": len(win.tokens), "seq_len": a.seq_len, **summarize(per, "llama.cpp Q4_0"),
                                   "vs_imatrix": {k: v[f"kl_reduction_vs_{ref_imatrix}"] for k, v in
                                                  summarize(per, ref_imatrix).items() if k != "FP16"}}
    result["wall_seconds"] = time.perf_counter() - t0
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    print(f"{'variant':72s} {'MB':>6s}", *(f"{s.split(':')[-1][:22]:>24s}" for s in texts))
    for k in files:
        if k == "FP16":
            continue
        cells = []
        for s in texts:
            d = result["domains"][s][k]
            cells.append(f"KL {d['kl_mean']:.4f} ({d['kl_reduction_vs_llama.cpp Q4_0'] * 100:+.0f}%)".rjust(24))
        print(f"{k:72s} {files[k].stat().st_size / 1e6:6.1f}", *cells)


if __name__ == "__main__":
    main()
