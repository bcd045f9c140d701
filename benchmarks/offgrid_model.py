#!/usr/bin/env python3
"""A 16-bit copy of a checkpoint whose weights lie on no quantization grid, computing the same function.

The demo model was made from a Q4_1 GGUF, so its weights sit on asymmetric 4-bit blocks of 32: a
type that can re-find that grid (Q4_1, Q5_1, the K-quants' 32-value sub-blocks with their minimums)
rounds them almost without loss, and comparisons between quantizers are flattered by it. This
writes the same network with SpinQuant's R1 (hidden size) and R2 (head dimension) random Hadamard
rotations fused into its weights by llm-compressor's SpinQuantModifier (norms fused, embeddings
untied): the logits are the same up to 16-bit rounding, and no weight is on a 4-bit grid any more.

  python benchmarks/offgrid_model.py demo --out runs/offgrid-demo
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)


def q4_1_residue(model_dir: Path) -> float:
    """Mean relative error of rounding the decoder layers' linear weights to Q4_1 (grid_check.py):
    about 0 on the demo, whose weights are on that grid; that of Gaussian weights off it."""
    import torch
    from grid_check import rtn_relative_error
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")
    errs = [
        rtn_relative_error(w.float(), 32, "float-min")
        for k, w in weights.items()
        if ".layers." in k and k.endswith("proj.weight") and w.dim() == 2
    ]
    return float(torch.tensor(errs).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a checkpoint directory or a name quantkit knows (demo)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.out.exists():
        sys.exit(f"{a.out} exists")
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.transform import SpinQuantModifier

    from quantkit.methods.patches import llmcompressor_spinquant_keep_embeddings
    from quantkit.models.checkpoint import load_model
    from quantkit.models.resolve import resolve_path

    llmcompressor_spinquant_keep_embeddings()  # as quantkit's spinquant step: the same function, to float rounding

    src = resolve_path(a.model, pull=False)
    torch.manual_seed(a.seed)
    model = load_model(src, dtype="float32", device="cpu").eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(a.seed))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    oneshot(model=model, recipe=[SpinQuantModifier(rotations=["R1", "R2"], transform_type="random-hadamard")])
    with torch.no_grad():
        after = model(input_ids=ids).logits
    logp, logq = torch.log_softmax(before.double(), -1), torch.log_softmax(after.double(), -1)
    kl = float((logp.exp() * (logp - logq)).sum(-1).mean())
    top1 = float((before.argmax(-1) == after.argmax(-1)).double().mean())
    if kl > 1e-6:
        sys.exit(f"the rotated model's next-token distributions moved by KL {kl:.4g}: not the same function")
    model.config._name_or_path = ""
    tmp = a.out.with_name(a.out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.float16).save_pretrained(tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.pop("quantization_config", None)  # the rotations are in the weights: a plain 16-bit checkpoint
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (tmp / "recipe.yaml").unlink(missing_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, tmp / name)
    with torch.no_grad():  # as saved, in 16 bits: what every tool reads
        saved = torch.log_softmax(
            load_model(tmp, dtype="float32", device="cpu").eval()(input_ids=ids).logits.double(), -1
        )
    kl16 = float((logp.exp() * (logp - saved)).sum(-1).mean())
    (tmp / "offgrid.json").write_text(
        json.dumps(
            {
                "source": a.model,
                "rotations": ["R1", "R2"],
                "transform_type": "random-hadamard",
                "seed": a.seed,
                "kl_to_source_fp32": kl,
                "top1_agreement_fp32": top1,
                "kl_to_source_saved_16bit": kl16,
            },
            indent=1,
        )
        + "\n"
    )
    info = json.loads((tmp / "offgrid.json").read_text())
    info["q4_1_rounding_error"] = {"source": q4_1_residue(src), "rotated": q4_1_residue(tmp)}
    (tmp / "offgrid.json").write_text(json.dumps(info, indent=1) + "\n")
    tmp.rename(a.out)
    print(a.out)


if __name__ == "__main__":
    main()
