"""`--plan`: the cost model's arithmetic against hand-computed values, and the four commands'
plans from headers alone (no weight loaded, nothing written), fitting or not."""

import json
import struct
from pathlib import Path

import pytest
from fixtures import RECIPES

from quantkit.costs.formulas import (
    BASE_RSS,
    COMPILE_RSS,
    GB,
    RETAINED,
    BenchWork,
    ConvertWork,
    Machine,
    Model,
    activation_bytes,
    bench_plan,
    combine,
    convert_plan,
    eval_plan,
    forward_flops,
    hessian_bytes,
    hessian_flops,
    solve_flops,
    window_bytes,
)

CALIB = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]
# A layer of two linears: (out, in) = (6, 4) and (4, 6); 3 layers, hidden 4, vocab 10.
TOY = Model(
    params=200,
    weight_bytes=400,
    itemsize=2,
    layers=3,
    hidden=4,
    vocab=10,
    q_dim=4,
    layer_linears=((6, 4), (4, 6)),
    head=(10, 4),
)


def machine(ram=100 * GB, device_free=None, disk=1000 * GB, device_type="cpu") -> Machine:
    return Machine(
        device="cpu" if device_type == "cpu" else "cuda:0",
        device_type=device_type,
        name="test",
        ram_available=int(ram),
        device_free=int(device_free if device_free is not None else ram),
        disk_free=int(disk),
        read_bps=10 * GB,
        bf16_flops=1e12,
        fp32_flops=5e11,
        probe="test",
    )


def costs(method: str) -> dict:
    """The cost constants of a registered method (methods/method_registry.py), as the plan reads them."""
    from quantkit.methods.method_registry import METHODS

    m = METHODS[method]
    return dict(calibrates=m.calibrates, passes=m.passes, hessians=m.hessians, layerwise=m.layerwise)


def work(method="gptq", **kw) -> ConvertWork:
    base = dict(
        calib_tokens=512,
        seq_len=128,
        calib_itemsize=2,
        artifact_bytes=100,
        disk_bytes=200,
        offload_cpu_bytes=None,
        first_hash=False,
        **costs(method),
    )
    return ConvertWork(**{**base, **kw})


def test_flops_by_hand():
    # linear: 2 * 3 layers * (24 + 24) params * 10 tokens = 2880; attention: 2 * 3 * 5 * 4 * 10 = 1200
    assert forward_flops(TOY, tokens=10, seq_len=5) == 2880 + 1200
    assert forward_flops(TOY, tokens=10, seq_len=5, with_head=True) == 2880 + 1200 + 2 * 10 * 4 * 10
    assert hessian_flops(TOY, tokens=10) == 2 * 10 * 3 * (16 + 36)
    assert solve_flops(TOY) == 3 * ((6 * 16 + 64) + (4 * 36 + 216))
    assert hessian_bytes(TOY) == 4 * (16 + 36)
    assert activation_bytes(TOY, tokens=10, seq_len=5, itemsize=2) == 2 * 10 * 4 * 2
    assert window_bytes(TOY, seq_len=5) == 4 * 5 * 6 * 3 + 4 * 5 * 5 * 1


def test_time_grows_linearly_in_calibration_tokens():
    t1 = convert_plan(TOY, work(calib_tokens=1000), machine()).time_breakdown
    t2 = convert_plan(TOY, work(calib_tokens=2000), machine()).time_breakdown
    assert t2["hessians"] == pytest.approx(2 * t1["hessians"], rel=0.05)
    assert t2["calibration_forward"] == pytest.approx(2 * t1["calibration_forward"], rel=0.05)


def test_rtn_has_no_calibration_cost():
    plan = convert_plan(TOY, work(method="rtn", calib_tokens=0), machine())
    assert "hessians" not in plan.time_breakdown and plan.stages["calibration_working_set"] == 0


def test_fits_and_each_way_of_not_fitting():
    big = Model(**{**TOY.__dict__, "params": 20 * 10**9, "weight_bytes": 40 * 10**9})
    assert convert_plan(TOY, work(), machine()).fits
    ram = convert_plan(big, work(), machine(ram=16 * GB))
    assert not ram.fits and "RAM" in ram.problems[0] and any("--max-memory" in a for a in ram.advice)
    disk = convert_plan(TOY, work(disk_bytes=10 * GB), machine(disk=1 * GB))
    assert not disk.fits and any("--out" in a for a in disk.advice)
    gpu = convert_plan(big, work(layerwise=False), machine(device_free=1 * GB, device_type="cuda"))
    assert not gpu.fits and gpu.peak_vram > 1 * GB and any("--device cpu" in a for a in gpu.advice)


def test_offloaded_plan_keeps_ram_within_budget():
    big = Model(**{**TOY.__dict__, "params": 10 * 10**9, "weight_bytes": 20 * 10**9})
    plan = convert_plan(big, work(offload_cpu_bytes=4 * 10**9, artifact_bytes=6 * 10**9), machine(ram=16 * GB))
    assert plan.offload and plan.fits and plan.peak_ram < 16 * GB


def test_eval_advises_bfloat16_when_float32_does_not_fit():
    big = Model(**{**TOY.__dict__, "params": 8 * 10**9, "weight_bytes": 16 * 10**9, "vocab": 128256})
    plan = eval_plan(big, big, 8192, 512, 4, machine(ram=24 * GB), 16 * 10**9, first_hash=False)
    assert not plan.fits and plan.advice[0].startswith("--dtype bfloat16")
    assert eval_plan(big, big, 8192, 512, 2, machine(ram=64 * GB), 16 * 10**9, first_hash=False).fits


def test_combine_adds_times_and_takes_the_largest_peak():
    a, b = convert_plan(TOY, work(), machine()), convert_plan(TOY, work(method="rtn", calib_tokens=0), machine())
    both = combine("run", [a, b])
    assert both.seconds == pytest.approx(a.seconds + b.seconds) and both.peak_ram == max(a.peak_ram, b.peak_ram)


# ---------------------------------------------------------------- through the CLI


@pytest.fixture
def no_weights(monkeypatch):
    """A plan must not load a weight: every loader fails the test; the probe is a fixed figure."""
    import safetensors.torch
    import transformers

    import quantkit.costs.commands as planner

    def fail(*a, **k):
        pytest.fail("a plan loaded weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    monkeypatch.setattr(safetensors.torch, "load_file", fail)
    monkeypatch.setattr(
        planner, "quick_probe", lambda device: {"read_bps": 10 * GB, "bfloat16_flops": 1e11, "float32_flops": 1e11}
    )


def header_params(path: Path) -> int:
    n = 0
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            for name, info in json.loads(fh.read(size)).items():
                if name != "__metadata__":
                    count = 1
                    for d in info["shape"]:
                        count *= d
                    n += count
    return n


@pytest.mark.parametrize("arch", ["llama-gqa", "llama-mha", "mistral", "qwen2"])
@pytest.mark.parametrize("recipe", ["int4-w4a16-gptq-g64", "int4-w4a16-rtn", "int8-w8a16-gptq", "bnb-nf4", "gqa"])
def test_convert_plan_from_headers(cli, tiny_dir, tiny_text, tmp_path, no_weights, arch, recipe):
    out = tmp_path / "art"
    extra = ["--set", "steps[0].gqa.kv_heads=1"] if recipe == "gqa" else []
    code, _, err, plan = cli(
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(tiny_dir / arch),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        *CALIB,
        *extra,
        "--plan",
        "--json",
    )
    assert code == 0, err
    assert plan["command"] == "convert" and plan["fits"] and not out.exists()
    assert plan["model"]["params"] == header_params(tiny_dir / arch)  # tied embeddings stored once, counted once
    assert plan["stages"]["source"] == plan["model"]["weight_bytes"] > 0
    assert plan["peak_ram"] > plan["stages"]["calibration_model"] and plan["seconds"] > 0 and plan["disk"] > 0
    assert plan["machine"]["device"] == "cpu" and not plan["offload"]
    calibrated = recipe in ("int4-w4a16-gptq-g64", "int8-w8a16-gptq")
    assert ("hessians" in plan["time_breakdown"]) == calibrated


def test_plan_predicts_the_artifact_size(cli, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "art"
    args = [
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--json",
    ]
    code, _, err, plan = cli(*args, "--plan")
    assert code == 0, err
    code, _, err, _ = cli(*args)
    assert code == 0, err
    actual = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    assert plan["stages"]["artifact"] == pytest.approx(actual, rel=0.15)


def test_plan_that_does_not_fit_exits_2_with_the_plan_and_one_line(
    cli, tiny_llama, tiny_text, tmp_path, no_weights, monkeypatch
):
    import psutil

    class Mem:
        available = 100_000  # 100 kB of RAM

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem())
    code, out, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--calib",
        f"file:{tiny_text}",
        *CALIB,
        "--plan",
        "--json",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not fit" in err and "to fit:" in err
    plan = json.loads(out)
    assert not plan["fits"] and plan["problems"] and plan["advice"]


def test_plan_on_an_unavailable_device(cli, tiny_llama, tiny_text, tmp_path, no_weights, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--device",
        "cuda",
        "--plan",
    )
    assert code == 2 and "no CUDA GPU" in err


def test_plan_text_output(cli, tiny_llama, tiny_text, tmp_path, no_weights):
    code, out, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--calib",
        f"file:{tiny_text}",
        *CALIB,
        "--plan",
    )
    assert code == 0, err
    assert "plan: convert on cpu" in out and "peak memory" in out and "time" in out and "DOES NOT FIT" not in out


def test_eval_plan(cli, tiny_llama, tiny_dir, tiny_text, no_weights):
    code, _, err, plan = cli(
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--text",
        f"file:{tiny_text}",
        "--seq-len",
        "64",
        "--max-tokens",
        "256",
        "--plan",
        "--json",
    )
    assert code == 0, err
    assert plan["command"] == "eval" and plan["fits"] and "baseline_pass" in plan["time_breakdown"]
    assert "4 windows of 64 tokens" in plan["notes"][0]
    assert plan["stages"]["model_loaded"] == 0  # the baseline against itself: scored from the baseline pass alone


def test_bench_plan(cli, tiny_llama, no_weights):
    code, _, err, plan = cli("bench", str(tiny_llama), "--device", "cpu", "--engine", "eager", "--plan", "--json")
    assert code == 0, err
    assert plan["command"] == "bench" and plan["stages"]["largest_loaded"] > 0 and "model_0" in plan["time_breakdown"]


def test_bench_plan_of_a_synthetic_shape(cli, no_weights):
    code, _, err, plan = cli(
        "bench", "--shape", "llama3.2-1b", "--shape-bits", "16,4", "--device", "cpu", "--plan", "--json"
    )
    assert code == 0, err
    assert plan["model"]["params"] == 1_235_814_400  # Llama-3.2-1B's published parameter count
    assert plan["stages"]["largest_loaded"] == pytest.approx(1_235_814_400 * 2, rel=0.01)


def test_run_plan(cli, tiny_llama, tiny_text, tmp_path, no_weights):
    recipe = tmp_path / "suite.yaml"
    recipe.write_text(
        f"model: {tiny_llama}\ncalibration: {{source: 'file:{tiny_text}', samples: 8, seq_len: 64}}\n"
        "variants:\n  - recipe: " + str(RECIPES / "int4-w4a16-rtn.yaml") + "\n"
        "  - recipe: " + str(RECIPES / "int4-w4a16-gptq-g64.yaml") + "\n"
    )
    code, _, err, plan = cli(
        "run",
        str(recipe),
        "--out",
        str(tmp_path / "run"),
        "--include-dir",
        str(RECIPES),
        "--plan",
        "--json",
    )
    assert code == 0, err
    steps = list(plan["time_breakdown"])
    # no eval text in the recipe: the run evaluates the two default domains (quantkit/evals/domains.py), and plans them
    assert [s.split(":")[1] for s in steps] == ["convert", "convert", "eval", "eval", "bench"] and not (
        tmp_path / "run"
    ).exists()


def test_run_plan_counts_every_engine(cli, tiny_llama, tiny_text, tmp_path, no_weights):
    """A suite that evaluates and benches on two engines (like the built-in
    demo-full recipe) plans each engine's work."""
    recipe = tmp_path / "suite.yaml"
    recipe.write_text(
        f"model: {tiny_llama}\ncalibration: {{source: 'file:{tiny_text}', samples: 8, seq_len: 64}}\n"
        f"eval: {{texts: ['file:{tiny_text}'], engines: [transformers, llamacpp]}}\n"
        "bench: {engines: [compiled, llamacpp]}\n"
        "variants:\n  - recipe: " + str(RECIPES / "int4-w4a16-rtn.yaml") + "\n"
    )
    code, _, err, plan = cli(
        "run",
        str(recipe),
        "--out",
        str(tmp_path / "run"),
        "--include-dir",
        str(RECIPES),
        "--plan",
        "--json",
    )
    assert code == 0, err
    steps = [s.split(":")[1] for s in plan["time_breakdown"]]
    assert steps == ["convert", "eval", "eval", "bench", "bench"]
    compiled, llamacpp = (plan["time_breakdown"][k] for k in list(plan["time_breakdown"])[-2:])
    assert compiled > llamacpp  # torch.compile's cost is the compiled engine's alone


def test_float32_checkpoint_counts_four_bytes(cli, tiny_dir, tiny_text, tmp_path, no_weights):
    from fixtures import build_checkpoint

    src = build_checkpoint(tmp_path / "f32", "qwen2", tiny_dir / "tokenizer", dtype="float32")
    code, _, err, plan = cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(src),
        "--out",
        str(tmp_path / "a"),
        "--plan",
        "--json",
    )
    assert code == 0, err
    params = plan["model"]["params"]
    assert plan["stages"]["source"] == 4 * params and plan["stages"]["reload_check"] == 4 * params
    # 4-bit weights calibrate in float32 on the CPU (calibration.compute_dtype: auto; quantize/job.py calib_precision)
    assert plan["stages"]["calibration_model"] == 4 * params


def test_truncated_checkpoint_is_one_line(cli, tiny_llama, tmp_path, no_weights):
    import shutil

    src = tmp_path / "broken"
    shutil.copytree(tiny_llama, src)
    shard = next(src.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(src),
        "--out",
        str(tmp_path / "a"),
        "--plan",
        "--json",
    )
    assert code == 2 and "truncated" in err and len(err.strip().splitlines()) == 1


def test_recorded_probe_figures_replay(monkeypatch):
    import torch

    from quantkit.costs.commands import this_machine

    monkeypatch.setenv("QUANTKIT_PLAN_PROBE", json.dumps({"read_bps": 1e10, "bf16_flops": 2e11, "fp32_flops": 1e11}))
    mc = this_machine(torch.device("cpu", 0))
    assert (
        (mc.read_bps, mc.bf16_flops, mc.fp32_flops) == (1e10, 2e11, 1e11)
        and mc.device == "cpu:0"
        and mc.device_type == "cpu"
    )


def test_quick_probe_measures_this_device():
    import torch

    from quantkit.costs.commands import quick_probe

    figures = quick_probe(torch.device("cpu"))
    assert set(figures) == {"read_bps", "bfloat16_flops", "float32_flops"} and all(v > 0 for v in figures.values())


def test_convert_warns_before_loading_when_the_plan_does_not_fit(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.costs.formulas as plan

    monkeypatch.setitem(plan.BASE_RSS, "convert", 10**15)  # a petabyte of libraries: no machine has that
    code, _, err, data = cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--json",
    )
    assert code == 0, err  # a prediction warns; it does not refuse
    lines = err.splitlines()
    warning = next(i for i, ln in enumerate(lines) if ln.startswith("warning: this conversion needs about"))
    loading = next(i for i, ln in enumerate(lines) if ln.startswith("loading"))
    assert warning < loading and "--plan" in lines[warning]


def test_plan_says_when_it_will_offload(cli, tiny_llama, tmp_path, no_weights):
    args = [
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--plan",
        "--json",
    ]
    code, _, err, plan = cli(*args)
    assert code == 0 and not plan["offload"], err
    code, _, err, small = cli(*args, "--max-memory", "100KB")
    assert code == 0 and small["offload"], err
    assert small["disk"] > plan["disk"]  # the offloaded weights share the disk with the artifact
    assert small["stages"]["reload_check"] <= 100_000  # the reload check is offloaded the same way


def _bench_work(loaded, refs, compile_s=0.0):
    n = len(loaded)
    return BenchWork(
        prompt_len=8,
        gen_len=4,
        runs=3,
        bytes_per_token=tuple(float(b) for b in loaded),
        loaded_bytes=tuple(loaded),
        compile_s=compile_s,
        prefill_flops=(1e9,) * n,
        reference_bytes=tuple(refs),
    )


def test_bench_peak_is_the_reference_phase_or_the_engine_phase():
    kv = 2 * TOY.layers * TOY.q_dim * (8 + 4) * 2
    big, small = 2 * GB, 1 * GB
    # self-check on: the float32 reference (2x a bf16 model) beside the mapped checkpoint is the peak
    p = bench_plan(TOY, _bench_work([big, small], [2 * big, 2 * big]), machine())
    assert p.peak_ram == int(BASE_RSS["bench"] + 3 * big)
    # no reference: the engine's model, what the allocator keeps of the previous one, the KV cache
    p = bench_plan(TOY, _bench_work([big, small], [0, 0]), machine())
    assert p.peak_ram == int(BASE_RSS["bench"] + (1 + RETAINED) * big + kv)
    # torch.compile on a cold cache joins the engine phase, which then can exceed the reference phase
    p = bench_plan(TOY, _bench_work([small], [2 * small], compile_s=15.0), machine())
    assert p.peak_ram == int(BASE_RSS["bench"] + (1 + RETAINED) * small + kv + COMPILE_RSS)
    # on a GPU the weights and the reference live in device memory, not RAM; a float32 reference
    # over a third of the free memory is loaded in bfloat16 instead (bench/selfcheck.reference_dtype)
    p = bench_plan(TOY, _bench_work([big], [2 * big]), machine(device_type="cuda", ram=100 * GB))
    assert p.peak_ram == int(BASE_RSS["bench"]) and p.peak_vram == int(2 * big)
    p = bench_plan(TOY, _bench_work([big], [2 * big]), machine(device_type="cuda", device_free=10 * GB))
    assert p.peak_vram == int(big + kv)


# ---------------------------------------------------------------- --plan makes the command's own checks


def _refusal(cli, args) -> tuple[int, str]:
    """(exit code, the one error line); progress notes may come before it."""
    code, _, err, _ = cli(*args)
    errors = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0] and "Traceback" not in err, err
    return code, errors[0]


def _same_refusal(cli, args, needle, tmp_path, before):
    """The command and its --plan refuse alike: exit 2 and the same line, before loading anything
    (no_weights), and neither writes a file."""
    code, line = _refusal(cli, args)
    plan_code, plan_line = _refusal(cli, [*args, "--plan"])
    assert (code, plan_code) == (2, 2) and plan_line == line and needle in line, (line, plan_line)
    assert _files(tmp_path) == before


def _files(tmp_path) -> list[Path]:
    """Every path under tmp_path but QUANTKIT_HOME's (conftest puts it there; checkpoint hashes are memoized in it)."""
    return sorted(p for p in tmp_path.rglob("*") if "qk-home" not in p.relative_to(tmp_path).parts)


def _src(tmp_path, tiny_llama) -> Path:
    """A copy of the checkpoint in a directory of its own (tmp_path also holds QUANTKIT_HOME)."""
    import shutil

    return Path(shutil.copytree(tiny_llama, tmp_path / "box" / "src"))


def _binary(tmp_path) -> Path:
    p = tmp_path / "random.txt"
    p.write_bytes(bytes(range(256)) * 64)
    return p


GPTQ = str(RECIPES / "int4-w4a16-gptq-g64.yaml")

# case -> (args after `convert RECIPE --model SRC`, a part of the refusal); {src} {tmp} {text} {binary} filled in
CONVERT_REFUSALS = {
    "--out is the source": (["--out", "{src}", "--calib", "file:{text}"], "is the source checkpoint"),
    "--out inside the source": (["--out", "{src}/int4", "--calib", "file:{text}"], "is inside the source checkpoint"),
    "--out contains the source": (["--out", "{src}/..", "--calib", "file:{text}"], "contains the source checkpoint"),
    "--out contains the calibration text": (
        ["--out", "{tmp}/texts", "--calib", "file:{tmp}/texts/calib.txt"],
        "contains the calibration text",
    ),
    "--out is not an artifact": (
        ["--out", "{tmp}/texts", "--calib", "file:{text}", "--force"],
        "is not a quantkit artifact",
    ),
    "missing --calib file": (["--out", "{tmp}/a", "--calib", "file:{tmp}/none.txt"], "no such text file"),
    "binary --calib": (["--out", "{tmp}/a", "--calib", "file:{binary}"], "not UTF-8 text"),
    "no calibration text": (["--out", "{tmp}/a", "--set", "calibration.source="], "needs calibration text"),
    "windows beyond the context": (
        ["--out", "{tmp}/a", "--calib", "file:{text}", "--set", "calibration.seq_len=2048"],
        "calibration.seq_len 2048 is longer than the model's context of 1024 tokens",
    ),
}


def _fill(args, **values) -> list[str]:
    return [a.format(**values) for a in args]


@pytest.mark.parametrize("case", list(CONVERT_REFUSALS))
def test_convert_plan_refuses_what_convert_refuses(cli, tiny_llama, tiny_text, tmp_path, no_weights, case):
    src, binary = _src(tmp_path, tiny_llama), _binary(tmp_path)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "calib.txt").write_bytes(Path(tiny_text).read_bytes())
    args, needle = CONVERT_REFUSALS[case]
    before = _files(tmp_path)
    _same_refusal(
        cli,
        [
            "convert",
            GPTQ,
            "--model",
            str(src),
            *_fill(args, src=src, tmp=tmp_path, text=tiny_text, binary=binary),
            *CALIB[:2],
        ],
        needle,
        tmp_path,
        before,
    )


def test_convert_plan_refuses_a_missing_model(cli, tmp_path, tiny_text, no_weights):
    _same_refusal(
        cli,
        [
            "convert",
            GPTQ,
            "--model",
            str(tmp_path / "nothing"),
            "--out",
            str(tmp_path / "a"),
            "--calib",
            f"file:{tiny_text}",
        ],
        "no such file or directory",
        tmp_path,
        _files(tmp_path),
    )


def _fake_artifact(tmp_path, tiny_llama) -> Path:
    """A checkpoint whose quantkit.json says it was converted from another checkpoint."""
    import shutil

    art = Path(shutil.copytree(tiny_llama, tmp_path / "art"))
    (art / "quantkit.json").write_text(
        json.dumps({"kind": "quantkit-artifact", "source": {"path": "/elsewhere", "sha256": "0" * 64}})
    )
    return art


EVAL_REFUSALS = {
    "baseline mismatch": (["{art}", "--baseline", "{src}", "--text", "file:{text}"], "is not the checkpoint"),
    "missing --text": (["{src}", "--baseline", "{src}", "--text", "file:{tmp}/none.txt"], "no such text file"),
    "binary --text": (["{src}", "--baseline", "{src}", "--text", "file:{binary}"], "not UTF-8 text"),
    "the same text twice": (
        ["{src}", "--baseline", "{src}", "--text", "file:{text}", "--text", "file:{tmp}/link.txt"],
        "the same text",
    ),
    "windows beyond the context": (
        ["{src}", "--baseline", "{src}", "--text", "file:{text}", "--seq-len", "2048", "--max-tokens", "4096"],
        "--seq-len 2048 is longer than the model's context",
    ),
    "text shorter than a window": (
        ["{src}", "--baseline", "{src}", "--text", "file:{tmp}/short.txt"],
        "shorter than one",
    ),
    "missing model": (["{tmp}/nothing", "--baseline", "{src}", "--text", "file:{text}"], "no such file or directory"),
}


@pytest.mark.parametrize("case", list(EVAL_REFUSALS))
def test_eval_plan_refuses_what_eval_refuses(cli, tiny_llama, tiny_text, tmp_path, no_weights, case):
    src, binary, art = _src(tmp_path, tiny_llama), _binary(tmp_path), _fake_artifact(tmp_path, tiny_llama)
    (tmp_path / "link.txt").symlink_to(tiny_text)
    (tmp_path / "short.txt").write_text("A few words.\n")
    args, needle = EVAL_REFUSALS[case]
    before = _files(tmp_path)
    window = [] if "--seq-len" in args else ["--seq-len", "64"]
    _same_refusal(
        cli,
        ["eval", *_fill(args, src=src, art=art, tmp=tmp_path, text=tiny_text, binary=binary), *window],
        needle,
        tmp_path,
        before,
    )


RUN_REFUSALS = {
    "--out is the source": (["--out", "{src}"], "is the source checkpoint"),
    "--out inside the source": (["--out", "{src}/run"], "is inside the source checkpoint"),
    "--out contains the source": (["--out", "{src}/.."], "contains the source checkpoint"),
    "--out contains the recipe": (["--out", "{tmp}/recipes"], "contains the recipe file"),
    "missing --calib file": (["--out", "{tmp}/run", "--calib", "file:{tmp}/none.txt"], "no such text file"),
    "binary --calib": (["--out", "{tmp}/run", "--calib", "file:{binary}"], "not UTF-8 text"),
    "missing --eval-text": (["--out", "{tmp}/run", "--eval-text", "file:{tmp}/none.txt"], "no such text file"),
    "binary --eval-text": (["--out", "{tmp}/run", "--eval-text", "file:{binary}"], "not UTF-8 text"),
    "the same eval text twice": (
        ["--out", "{tmp}/run", "--eval-text", "file:{text}", "--eval-text", "file:{tmp}/copy.txt"],
        "is the same text as",
    ),
    "eval windows beyond the context": (
        ["--out", "{tmp}/run", "--eval-text", "file:{text}", "--set", "eval.seq_len=2048"],
        "eval.seq_len 2048 is longer than the model's context",
    ),
    "missing model": (["--out", "{tmp}/run", "--model", "{tmp}/nothing"], "no such file or directory"),
}


@pytest.mark.parametrize("case", list(RUN_REFUSALS))
def test_run_plan_refuses_what_run_refuses(cli, tiny_llama, tiny_text, tmp_path, no_weights, case):
    src, binary = _src(tmp_path, tiny_llama), _binary(tmp_path)
    (tmp_path / "copy.txt").write_bytes(Path(tiny_text).read_bytes())
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "suite.yaml"
    recipe.write_text(
        f"model: {src}\ncalibration: {{source: 'file:{tiny_text}', samples: 8, seq_len: 64}}\n"
        "variants:\n  - name: int4\n    steps:\n      - quantize: {method: gptq, group_size: 64}\n"
    )
    args, needle = RUN_REFUSALS[case]
    before = _files(tmp_path)
    _same_refusal(
        cli,
        ["run", str(recipe), *_fill(args, src=src, tmp=tmp_path, text=tiny_text, binary=binary)],
        needle,
        tmp_path,
        before,
    )


def test_run_plan_names_a_variant_the_run_would_fail(cli, tiny_llama, tmp_path, no_weights):
    """A variant whose own checks fail is reported failed by the run, which goes on with the others;
    its plan stops on the same line, naming the variant."""
    recipe = tmp_path / "suite.yaml"
    recipe.write_text(
        f"model: {tiny_llama}\nvariants:\n  - name: ok\n    steps:\n      - quantize: {{method: rtn, group_size: 64}}\n"
        "  - name: bad\n    steps:\n      - quantize: {method: gptq, group_size: 64}\n"
    )
    code, line = _refusal(cli, ["run", str(recipe), "--out", str(tmp_path / "run"), "--plan"])
    assert (
        code == 2
        and "variant bad would fail: " in line
        and "needs calibration text" in line
        and "goes on with the others" in line
    )
    assert not (tmp_path / "run").exists()


def test_bench_plan_refuses_what_bench_refuses(cli, tiny_llama, tmp_path, no_weights):
    """bench's checks before its probe (context length; memory) under --plan: all models failing is
    bench's own line; one of several failing names it."""
    args = [
        "bench",
        str(tiny_llama),
        "--device",
        "cpu",
        "--engine",
        "eager",
        "--prompt-len",
        "1000",
        "--gen-len",
        "100",
    ]
    _same_refusal(cli, args, "exceed the model's context (1024)", tmp_path, _files(tmp_path))
    code, line = _refusal(cli, ["bench", str(tiny_llama), "--shape", "llama3.2-1b", *args[2:], "--plan"])
    assert (
        code == 2
        and f"{tiny_llama} would fail: prompt + generated tokens (1100) exceed" in line
        and "goes on with the others" in line
    )


# ---------------------------------------------------------------- auto mixed precision's sensitivity pass


def test_sensitivity_pass_by_hand():
    """1 reference + 2 for the noise floor + units x layers at the base, and for each unit the
    budget can raise its choices and its noise check; a unit's forward runs its own layer on, so
    the base forwards cost L(L+1)/2 layers per unit and L heads, a raised unit's the average layer's."""
    from quantkit.costs.formulas import sensitivity_flops, sensitivity_forwards

    w = work(
        sensitivity_tokens=10, sensitivity_seq_len=5, sensitivity_units=4, sensitivity_schemes=2, sensitivity_raised=5
    )
    assert sensitivity_forwards(TOY, w) == 3 + 4 * 3 + 5 * 2
    layer = (2880 + 1200) / 3  # forward_flops(TOY, 10, 5) per layer
    head = 2 * 10 * 4 * 10
    assert sensitivity_flops(TOY, w) == pytest.approx(
        3 * (3 * layer + head) + 4 * (3 * head + layer * 6) + 5 * 2 * (head + layer * 2)
    )
    assert sensitivity_forwards(TOY, work()) == 0 and sensitivity_flops(TOY, work()) == 0


def test_the_units_a_budget_can_raise(tiny_llama):
    """auto.raisable: the cheapest raises first until the spare bits are spent (the plan's count)."""
    from quantkit.methods.schemes import Scheme
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.auto import Search, raisable
    from quantkit.quantize.preflight import meta_model
    from quantkit.quantize.sensitivity import decoder_layers

    layers = decoder_layers(meta_model(read_config(tiny_llama)))
    # 294,912 weights at 4.25; INT8 per channel adds 3.875 bits per weight of an o (16,384: 63,488 bits), a qkv
    # (32,768: 126,976), a gate_up (65,536: 253,952); 3.8125 of a down (32,768: 124,928)
    spec = lambda b: Search(Scheme(4, 64), (Scheme(8, -1),), ("qkv", "o", "gate_up", "down"), b, 16)  # noqa: E731
    assert raisable(layers, spec(4.25)) == 0
    assert raisable(layers, spec(4.25 + 63488 / 294912)) == 1
    assert raisable(layers, spec(4.25 + (2 * 63488 + 124928) / 294912)) == 3
    assert raisable(layers, spec(16)) == 8


def test_sensitivity_pass_costs_time_and_memory_in_proportion():
    # the demo's shape: 30 layers of 576 wide, a 49,152-token vocabulary
    demo = Model(
        params=135 * 10**6,
        weight_bytes=270 * 10**6,
        itemsize=2,
        layers=30,
        hidden=576,
        vocab=49152,
        q_dim=576,
        layer_linears=((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)),
        head=(49152, 576),
    )
    plain = convert_plan(demo, work(), machine())
    one = convert_plan(
        demo,
        work(
            sensitivity_tokens=1024,
            sensitivity_seq_len=256,
            sensitivity_units=4,
            sensitivity_schemes=2,
            sensitivity_raised=5,
        ),
        machine(),
    )
    two = convert_plan(
        demo,
        work(
            sensitivity_tokens=2048,
            sensitivity_seq_len=256,
            sensitivity_units=4,
            sensitivity_schemes=3,
            sensitivity_raised=10,
        ),
        machine(),
    )
    assert "sensitivity" not in plain.time_breakdown and "sensitivity_working_set" not in plain.stages
    assert two.time_breakdown["sensitivity"] > 2 * one.time_breakdown["sensitivity"] > 0
    assert two.stages["sensitivity_working_set"] > one.stages["sensitivity_working_set"] > 0
    assert (
        one.seconds > plain.seconds
        and one.peak_ram >= plain.peak_ram
        and f"about {3 + 4 * 30 + 5 * 2} forwards of 1024 tokens" in one.notes[0]
    )


def test_convert_plan_counts_the_sensitivity_pass(cli, tiny_llama, tiny_text, tmp_path, no_weights):
    recipe = str(RECIPES / "int4-w4a16-rtn.yaml")
    base = [
        "convert",
        recipe,
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "art"),
        "--calib",
        f"file:{tiny_text}",
        "--plan",
        "--json",
    ]
    code, _, err, plain = cli(*base)
    assert code == 0, err
    code, _, err, plan = cli(
        *base, "--set", "steps[0].quantize.auto={budget_bits: 4.5, windows: 4, seq_len: 128, choices: [int8, int4-g32]}"
    )
    assert code == 0, err
    assert plan["time_breakdown"]["sensitivity"] > 0 and "sensitivity" not in plain["time_breakdown"]
    assert plan["stages"]["sensitivity_working_set"] > 0 and plan["seconds"] > plain["seconds"]
    raised = int(plan["notes"][0].split(" units the budget can raise")[0].rsplit(" ", 1)[1])
    assert 0 < raised <= 8 and plan["notes"][0].startswith(
        f"auto mixed precision: about {3 + 4 * 2 + raised * 3} forwards of 512 tokens"
    )
    assert plan["stages"]["artifact"] < plain["stages"]["artifact"] * 4.5 / 4.25 * 1.01  # within the budget's bits


# ---------------------------------------------------------------- peaks measured on the shapes that missed
# peak RSS of the whole command (/usr/bin/time -v: the largest of quantkit and its children), in GB
MEASURED_BENCH_6_9M = 2.389  # `bench p66 --engine eager` (6.96M parameters): the device probe's child at 1 GiB
MEASURED_EVAL_262K = {2048: 7.222, 512: 3.991}  # eval of an INT4 artifact at a 262,144 vocabulary, float32, CPU


def test_bench_peak_counts_the_device_probe(monkeypatch):
    """The probe is a process of its own with a read buffer and its copy (2 x 1 GiB): it is the
    peak of a small model's bench, which the plan once put at 0.93 GB against 2.39 GB measured."""
    from quantkit.costs.formulas import probe_bytes

    monkeypatch.setenv("QUANTKIT_PROBE_MIB", "1024")
    p = bench_plan(TOY, _bench_work([14_000_000], [28_000_000]), machine())
    assert p.stages["device_probe"] == probe_bytes("cpu")[0] >= 2 * (1 << 30)
    assert abs(p.peak_ram / GB - MEASURED_BENCH_6_9M) <= 0.25 * MEASURED_BENCH_6_9M
    gpu = bench_plan(TOY, _bench_work([14_000_000], [28_000_000]), machine(device_type="cuda"))
    assert gpu.peak_vram >= 2 * (1 << 30) and gpu.peak_ram < GB  # on a GPU the buffers are device memory
    monkeypatch.setenv("QUANTKIT_PROBE_MIB", "64")
    assert bench_plan(TOY, _bench_work([14_000_000], [0]), machine()).peak_ram == int(
        BASE_RSS["bench"] + 1.5 * 14e6 + 2 * TOY.layers * TOY.q_dim * 12 * 2
    )


@pytest.mark.parametrize("seq_len", [2048, 512])
def test_eval_peak_counts_its_vocabulary_sized_arrays(seq_len):
    """A 262,144 vocabulary: a window's logits, their log-softmax and the exact KL's chunks of
    baseline rows; the plan once said 7.44 GB against 11.27 GB measured at 2,048 positions (the
    output layer's check then compared a whole window at once: 11.4 GB; now a chunk at a time)."""
    vocab, hidden, params = 262_144, 64, 16_851_264
    model = Model(params, params * 2, 2, 2, hidden, vocab, hidden, ((hidden, hidden),), (vocab, hidden))
    art = Model(params, 33_594_464, 2, 2, hidden, vocab, hidden, ((hidden, hidden),), (vocab, hidden))
    p = eval_plan(model, art, 4 * seq_len, seq_len, 4, machine(), art.weight_bytes, first_hash=True, exact_kl=True)
    measured = MEASURED_EVAL_262K[seq_len]
    assert abs(p.peak_ram / GB - measured) <= 0.25 * measured, (p.peak_ram / GB, measured)
