"""`quantkit pareto --plan`: the front's checks (those of its run: the model, --out, every text, and
each compressed-tensors variant's convert checks), then the predicted time and memory of every
point: its convert (costs/formulas.py) or its GGUF (costs/kquant_formulas.py), and its evaluation."""

from __future__ import annotations

import gguf
import torch

from quantkit.costs.commands import convert_work, read_model, this_machine
from quantkit.costs.formulas import Model, Plan, combine, convert_plan, eval_plan
from quantkit.costs.kquant_formulas import KquantWork, kquant_plan
from quantkit.evals.eval_settings import EvalSettings
from quantkit.gguf.type_report import main_type
from quantkit.pipeline.pareto import check_tools, runner
from quantkit.pipeline.pareto_settings import ParetoSettings
from quantkit.pipeline.run_costs import variant_job
from quantkit.quantize import kquant_chooser


def _gguf_bytes(m: Model, qtype: str) -> int:
    """About the file: every parameter at the type's main ggml type (a mix keeps some wider)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[main_type(qtype)]]
    return int(m.params * size / block)


def plan_pareto(s: ParetoSettings) -> Plan:
    check_tools(s)
    r, notes = runner(s)
    base = read_model(r.src)
    cpu = this_machine(torch.device("cpu"), s.out)
    c = r.recipe.calibration
    ev = EvalSettings.from_recipe(r.recipe.eval, "transformers", r.eval_texts, ())
    tokens = len(r.eval_texts) * (ev.max_tokens // ev.seq_len) * ev.seq_len
    plans: list[tuple[str, Plan]] = []  # (variant, its step's plan)
    imatrix_made, baseline_scored = False, False

    def evaluate(model_bytes: int, same: bool = False) -> Plan:
        nonlocal baseline_scored
        p = eval_plan(
            base,
            Model(**{**base.__dict__, "weight_bytes": model_bytes}),
            tokens,
            ev.seq_len,
            4,
            cpu,
            model_bytes,
            first_hash=False,
            same=same,
            exact_kl=ev.kl != "topk",
        )
        if baseline_scored:  # its pass is cached by the first evaluation
            p.seconds -= p.time_breakdown["baseline_pass"]
            p.time_breakdown["baseline_pass"] = 0.0
        baseline_scored = True
        return p

    for v in r.recipe.variants:
        if v.baseline:
            plans.append((v.name, evaluate(base.weight_bytes, same=True)))
        elif v.gguf is not None:
            size = _gguf_bytes(base, v.gguf.type)
            types = v.gguf.mixed_types or kquant_chooser.DEFAULT_TYPES
            mixed = dict(
                candidates=len(types),
                fisher_tokens=kquant_chooser.WINDOWS * kquant_chooser.SEQ_LEN * kquant_chooser.DRAWS,
                fisher_seq_len=kquant_chooser.SEQ_LEN,
                gptq_tokens=c.samples * c.seq_len,
            )
            work = KquantWork(
                calib_tokens=c.samples * c.seq_len if v.gguf.imatrix and not imatrix_made else 0,
                seq_len=c.seq_len,
                gguf_bytes=size,
                **(mixed if v.gguf.mixed else {}),
            )
            imatrix_made = imatrix_made or v.gguf.imatrix
            plans += [(v.name, kquant_plan(base, work, cpu)), (v.name, evaluate(size))]
        else:
            job = variant_job(r.conversion(v), v.name)
            model = read_model(job.src, skeleton=job.skeleton)
            made = convert_plan(model, convert_work(job), this_machine(job.device, r.dir))
            plans += [(v.name, made), (v.name, evaluate(job.artifact_bytes))]
    plan = combine("pareto", [p for _, p in plans])
    plan.time_breakdown = {f"{name}:{p.command}": round(p.seconds, 1) for name, p in plans}
    plan.notes += notes + [
        f"{len(r.recipe.variants) - 1} points and the baseline in {r.dir}; a re-run reuses every finished point, "
        "and the importance matrix is made once per checkpoint and calibration"
    ]
    return plan
