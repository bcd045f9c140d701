"""`run --plan`: the run's own checks, each variant's prepared convert job, then the cost of every
step the run would take (costs/commands.py costs each one; costs/formulas.py adds them up)."""

from __future__ import annotations

from quantkit.bench.bench_settings import BenchSettings
from quantkit.costs.commands import compile_seconds, convert_work, read_model, this_machine
from quantkit.costs.formulas import BenchWork, Model, Plan, bench_plan, combine, convert_plan, eval_plan, forward_flops
from quantkit.device import resolve_device
from quantkit.errors import QuantkitError, RecipeError
from quantkit.pipeline.run import Runner, with_baseline
from quantkit.quantize.job import check_inputs, prepare


def plan_run(recipe, opts) -> Plan:
    """The run's own checks (building run.Runner: the model, --out, every text), each variant's
    `convert` checks as the run passes them (quantize/job.py check_inputs and prepare), then each
    variant's convert, eval (when the run evaluates) and one bench of all per engine."""

    runner = Runner(recipe, opts)
    plans, shapes = [], []
    for v in with_baseline(recipe):
        if v.steps:
            job = variant_job(runner.conversion(v), v.name)
            model = read_model(job.src, skeleton=job.skeleton)
            plans.append(convert_plan(model, convert_work(job), this_machine(job.device, runner.dir)))
            shapes.append((model, job.artifact_bytes))
    ev = recipe.eval
    n_texts = len(runner.eval_texts)  # the recipe's, --eval-text, or the default domains (evals/domains.py)
    if shapes and n_texts:
        dev = _device(ev.device)
        mc = this_machine(dev)
        elem = 4 if (ev.dtype or ("float32" if dev.type == "cpu" else "bfloat16")) == "float32" else 2
        for (
            _engine
        ) in ev.engines:  # llama.cpp scores the same windows from a GGUF export: costed like transformers' pass
            for model, art in shapes:
                plans.append(
                    eval_plan(
                        model,
                        Model(**{**model.__dict__, "weight_bytes": art}),
                        n_texts * (ev.max_tokens // ev.seq_len) * ev.seq_len,
                        ev.seq_len,
                        elem,
                        mc,
                        art,
                        first_hash=True,
                    )
                )
    if shapes and not opts.skip_bench:
        plans += _bench_plans(recipe, shapes)
    if not plans:
        raise RecipeError(f"{recipe.name}: nothing to plan: no variant has steps")
    return combine("run", plans)


def variant_job(conversion: tuple, name: str):
    """The checks `run` has `convert` make for variant `name`, on what convert gets for it
    (Runner.conversion: the one-variant recipe, source, artifact directory, options). A variant that
    fails them is reported failed by the run, which goes on with the others; its plan stops here."""

    single, src, out, opts = conversion
    try:
        check_inputs(single, src, out, opts)
        return prepare(single, src, out, opts, name)
    except QuantkitError as exc:
        raise QuantkitError(
            f"variant {name} would fail: {exc} (the run reports it failed and goes on with the others)"
        ) from None


def _bench_plans(recipe, shapes) -> list[Plan]:
    """One bench of every variant and the baseline per engine of bench.engines."""

    b = recipe.bench
    model = shapes[0][0]
    n = len(shapes) + 1  # the variants and the baseline
    plans = []
    for engine in b.engines or (b.engine,):
        s = BenchSettings.from_recipe(b, engine)
        work = BenchWork(
            s.prompt_len,
            s.gen_len,
            s.warmups + s.repeats,
            tuple(float(a) for _, a in shapes) + (float(model.weight_bytes),),
            tuple(a for _, a in shapes) + (model.params * 2,),
            compile_seconds(s.engine),
            (forward_flops(model, s.prompt_len, s.prompt_len, with_head=True),) * n,
            (model.params * 4 if s.self_check else 0,) * n,  # the self-check's float32 reference load
        )
        plans.append(bench_plan(model, work, this_machine(s.device)))
    return plans


def _device(spec):
    return resolve_device(spec)
