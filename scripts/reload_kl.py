"""The reload check's KL (quantkit.json `verification.mean_kl`) across methods and models, and the
KL of things that are and are not faults, to size `quantkit/verify.py`'s KL_THRESHOLD.

    .venv/bin/python scripts/reload_kl.py fixtures OUT_DIR [RECIPE,...]   # the four tiny test checkpoints
    .venv/bin/python scripts/reload_kl.py demo OUT_DIR [RECIPE,...]       # the demo model (quantkit models pull demo)
    .venv/bin/python scripts/reload_kl.py noise                           # demo: thread count, batching, bf16 weights

Each conversion runs `quantkit convert` in its own process (calibration: 16 samples of WikiText-2
from /work/shared/data, or --text) and prints one JSON line; the artifacts are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = ["gqa", "int4-w4a16-rtn", "int4-w4a16-gptq-g64", "int8-w8a16-gptq", "int4-w4a16-awq", "int8-w8a8-smoothquant",
           "bnb-nf4", "bnb-int8"]


def convert(recipe: str, model: Path, out: Path, text: str, extra: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    if recipe == "gqa":  # the merge alone: recovery is a training run, its export the same dense save
        extra = [*extra, "--set", "steps[0].gqa.recover=null"]
    t = time.time()
    cmd = [str(REPO / ".venv/bin/quantkit"), "convert", str(REPO / "recipes" / f"{recipe}.yaml"), "--model", str(model),
           "--out", str(out), "--calib", f"file:{text}", "--set", "calibration.samples=16", "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(out, ignore_errors=True)
    row = {"recipe": recipe, "model": model.name, "seconds": round(time.time() - t, 1)}
    if p.returncode:
        return {**row, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    v = json.loads(p.stdout)["verification"]
    return {**row, **{k: v[k] for k in ("mean_kl", "max_kl", "top1_agreement", "loader")}}


def noise() -> dict:
    """What moves the demo's logits without a fault (thread count, batching) and with one (bf16 weights)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from quantkit.models.checkpoint import resolve_model
    from quantkit.quantize.verify import compare_logits, fixed_tokens

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("demo", pull=False)), dtype=torch.float16).eval()
    ids = fixed_tokens(model.config.vocab_size)

    def run(m, x, threads):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            return m(input_ids=x, use_cache=False).logits.float()

    ref = run(model, ids, 2)
    rows = {"threads 2 vs 1": run(model, ids, 1),
            "batch of 2 vs one row at a time": torch.cat([run(model, ids[i : i + 1], 2) for i in range(len(ids))]),
            "weights rounded to bf16 and back": run(copy.deepcopy(model).to(torch.bfloat16).to(torch.float16), ids, 2)}
    return {k: {kk: v for kk, v in compare_logits(ref, new).items() if kk != "finite"} for k, new in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["fixtures", "demo", "noise"])
    ap.add_argument("out", nargs="?", type=Path, default=Path("/tmp/qk-reload-kl"))
    ap.add_argument("recipes", nargs="?", default=",".join(RECIPES))
    ap.add_argument("--text", default="/work/shared/data/wikitext2-valid.txt")
    args = ap.parse_args()
    if args.what == "noise":
        print(json.dumps(noise(), indent=1))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "fixtures":
        sys.path.insert(0, str(REPO / "tests"))
        from fixtures import ARCHS, build_checkpoint, build_tokenizer

        root = args.out / "fixtures"
        if not root.exists():
            build_tokenizer(root / "tokenizer")
            for arch in ARCHS:
                build_checkpoint(root / arch, arch, root / "tokenizer")
        models, extra = [root / a for a in ARCHS], ["--set", "calibration.seq_len=128"]
    else:
        from quantkit.models.checkpoint import resolve_model

        models, extra = [resolve_model("demo", pull=False)], []
    for model in models:
        for recipe in args.recipes.split(","):
            print(json.dumps(convert(recipe, model, args.out / "artifact", args.text, extra)), flush=True)


if __name__ == "__main__":
    main()
