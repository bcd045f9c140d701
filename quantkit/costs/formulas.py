"""`--plan`: what a command will cost, before it loads a single weight.

From config.json and the safetensors headers alone (the model's skeleton on the meta device
gives the layer shapes): parameters, bytes at each stage, predicted peak RAM (and VRAM on a GPU),
disk, whether it offloads, and a time estimate from this device's probed figures and a model of
the work. The cost functions here are pure (numbers in, numbers out); reading headers and probing
the device live in costs/commands.py.

What the model counts (benchmarks/scale.py compares it with measurements):
- GPTQ (llm-compressor's sequential pipeline): per decoder layer two forwards of the calibration
  tokens (calibrate, then propagate the quantized output), 2·n·c² FLOPs to accumulate each
  linear's Hessian (c input columns, n tokens), and a solve of ~r·c² + c³ FLOPs (r rows) plus a
  Python step per column (llmcompressor/modifiers/gptq/gptq_quantize.py, one column at a time on
  the CPU). RTN: a pass over the weights' bytes.
- Auto mixed precision (quantize/auto.py, its lazy search): 1 reference forward and 2 for the
  noise floor, units x layers forwards at the base scheme, then each choice and a noise check for
  as many units as the budget can raise at most (auto.raisable; the search measures the units its
  solutions raise, re-solving until they are all measured), over windows x seq_len tokens; a unit's
  forward at layer i costs the last L - i layers and the LM head, and the log-softmax and KL of
  every token over the vocabulary; its memory is the reference's log-probabilities and layer
  outputs beside the model (sensitivity.working_set_bytes).
- Memory: the libraries' own footprint, the model at its calibration precision, one layer's
  Hessians and solve buffers, the calibration activations (llm-compressor keeps every sample's
  layer input), then the reload check: the artifact loaded back at the source precision beside
  what the allocator has not returned yet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from quantkit.bench import probe
from quantkit.bench.harness import prefill_samples
from quantkit.bench.selfcheck import reference_in_float32
from quantkit.core.roofline import predict_ttft_s
from quantkit.evals.accuracy_stats import KL_CHUNK
from quantkit.quantize.sensitivity import working_set_bytes

GB = 1e9

# Measured on this project's reference machine (2 Xeon cores with AMX, torch 2.13 CPU,
# `benchmarks/scale.py`); each is a fraction of a probed peak
# or a fixed cost, so another device scales them by its own probe.
BASE_RSS = {
    "convert": 1.00 * GB,
    "eval": 0.80 * GB,
    "bench": 0.90 * GB,
}  # torch + transformers (+ llm-compressor) imported
STARTUP_S = {"convert": 12.0, "eval": 8.0, "bench": 8.0}  # imports, config, tokenizer, hashing small files
MATMUL_EFF = 0.6  # share of the probed matmul rate that layer forwards and Hessian products reach (GPTQ at
# 135M-1.2B, 2026-11-30 quiet run: 0.45 over-predicted every size by 1.35-1.57x)
SOLVE_EFF = 0.15  # share of the fp32 matmul rate the GPTQ solve reaches (triangular solves, small blocks)
COLUMN_S = {"cpu": 60e-6, "cuda": 4e-6}  # GPTQ's per-column Python step (torch dispatch of ~10 small ops)
LOAD_BPS = 0.6 * GB  # safetensors -> torch tensors, including transformers' model init
HASH_BPS = 0.8 * GB  # sha256 of the checkpoint (models.checkpoint_hash), first run only
SAVE_BPS = 0.25 * GB  # compressed-tensors packing plus the write, per byte of the model at source precision
RETAINED = 0.5  # eval/bench: share of a freed model the allocator still holds when the next one loads
# convert: the calibration model is all still resident when the reload check loads the artifact
# beside it (measured: 3.7 GB before the reload of the 1.2B shape, peak 7.13 GB = that + 2.47 GB
# reloaded + the 1.04 GB artifact; benchmarks/scale.py); 0.5 under-predicted it by 19%
RELOAD_RETAINED = 1.0
# batch-1 decode reaches ~50% of the read floor on the CPU at 0.5-1.2B, 36% on the 135M demo (compiled
# engine's byte accounting; benchmarks/scale.py, rule check)
DECODE_EFF = 0.5
# torch.compile on a cold inductor cache (graph capture, codegen, C++ builds), on top of the engine's
# model: measured +2.35 GB on the demo's bench and +1.6 GB at 0.5B (benchmarks/scale.py);
# counted on the CPU, where the compiled engine runs its model
COMPILE_RSS = 2.4 * GB
PROBE_S = 8.0  # `bench`'s device probe, run before and after the timings
# The device probe is a process of its own (bench/probe.py), torch imported (0.232 GB measured:
# `/usr/bin/time -v python -c "import torch"`) with its read buffer, the copy's destination and two
# square matmul operands: 2.39 GB peak at its 1 GiB buffer, 0.375 GB at 64 MiB (/usr/bin/time -v
# python -m quantkit.bench.probe cpu); the peak of a bench of a small model is the probe's.
PROBE_BASE_RSS = 0.24 * GB
# --depth on an engine that compiles: each depth is a new static-cache size, so decode compiles again
# (the decode graph with its warm-ups: 7.5-16 s at 135M-1.2B on 2 CPU cores; benchmarks/scale.py)
DEPTH_COMPILE_S = 10.0


@dataclass(frozen=True)
class Model:
    """A checkpoint as its headers and config describe it."""

    params: int
    weight_bytes: int  # bytes of tensors on disk
    itemsize: int  # bytes per parameter of the source precision
    layers: int
    hidden: int
    vocab: int
    q_dim: int  # attention heads x head dim
    layer_linears: tuple[tuple[int, int], ...]  # (out, in) of each linear in one decoder layer
    head: tuple[int, int]  # (vocab, hidden) of the LM head

    @property
    def layer_linear_params(self) -> int:
        return sum(o * i for o, i in self.layer_linears)


@dataclass(frozen=True)
class Machine:
    device: str  # e.g. "cpu", "cuda:0"
    device_type: str  # torch.device.type
    name: str
    ram_available: int
    device_free: int  # free memory of the device (RAM on the CPU)
    disk_free: int
    read_bps: float
    bf16_flops: float
    fp32_flops: float
    probe: str  # where the figures come from


@dataclass
class Plan:
    command: str
    model: dict
    machine: dict
    stages: dict  # stage -> bytes
    peak_ram: int
    peak_vram: int | None
    disk: int
    offload: bool
    seconds: float
    time_breakdown: dict
    fits: bool = True
    problems: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- work (FLOPs and bytes)


def forward_flops(m: Model, tokens: int, seq_len: int, with_head: bool = False) -> float:
    """A forward over `tokens` tokens in windows of `seq_len`: 2 FLOPs per weight per token,
    plus attention's QK^T and PV (4·seq·q_dim per token and layer, half of it masked away)."""
    linear = 2.0 * m.layers * m.layer_linear_params * tokens
    attention = 2.0 * m.layers * seq_len * m.q_dim * tokens
    head = 2.0 * m.head[0] * m.head[1] * tokens if with_head else 0.0
    return linear + attention + head


def hessian_flops(m: Model, tokens: int) -> float:
    """X^T X of every linear's input, every layer (q/k/v each keep their own)."""
    return 2.0 * tokens * m.layers * sum(c * c for _, c in m.layer_linears)


def solve_flops(m: Model) -> float:
    """GPTQ per linear: Cholesky-based inverse (~c³) and the blocked column updates (~r·c²)."""
    return m.layers * sum(r * c * c + c**3 for r, c in m.layer_linears)


def hessian_bytes(m: Model) -> int:
    """One layer's Hessians (float32, c² each), held until that layer is solved."""
    return 4 * sum(c * c for _, c in m.layer_linears)


def solve_bytes(m: Model) -> int:
    """The largest linear's solve buffers: weight copies and Hessian copies in float32."""
    return max(4 * (3 * r * c + 3 * c * c) for r, c in m.layer_linears)


def activation_bytes(m: Model, tokens: int, seq_len: int, itemsize: int) -> int:
    """llm-compressor's intermediates cache: every calibration sample's layer input and output
    (hidden states), kept in RAM between layers (sequential_offload_device: cpu)."""
    return itemsize * tokens * m.hidden * 2


def window_bytes(m: Model, seq_len: int) -> int:
    """One calibration window's activations in flight through a layer (the widest linear's
    output, its float32 Hessian input copy, and the attention scores of every head)."""
    widest = max(o for o, _ in m.layer_linears)
    return 4 * seq_len * widest * 3 + 4 * seq_len * seq_len * max(1, m.q_dim // 64)


# ---------------------------------------------------------------- convert


@dataclass(frozen=True)
class ConvertWork:
    calib_tokens: int
    seq_len: int
    calib_itemsize: int  # bytes per parameter while calibrating
    artifact_bytes: int
    disk_bytes: int  # artifact plus headroom (and offloaded weights), artifact.disk_needed
    offload_cpu_bytes: int | None  # the RAM budget when the model is offloaded to disk
    layerwise: bool  # llm-compressor's pipeline: weights stay in RAM, one layer on the device
    first_hash: bool  # the checkpoint's sha256 is not memoized yet
    # What the method costs (methods/method_registry.py: calibrates, passes, hessians); a gqa step costs
    # its statistics pass and its recovery instead.
    calibrates: bool = False  # keeps calibration activations (llm-compressor's cache, a window in flight)
    passes: int = 0  # forwards over the calibration tokens per layer; 0: one elementwise pass over the weights
    hessians: bool = False  # GPTQ's per-layer Hessians and their solve
    gqa: bool = False
    recover_tokens: int = 0  # GQA recovery: distillation tokens ...
    recover_max_s: float = 0.0  # ... and its time bound (recover.max_minutes)
    # auto mixed precision's sensitivity pass: windows x seq_len tokens, units per layer, schemes
    # per unit (the base and each choice), units whose choices are measured; 0 tokens: no pass
    sensitivity_tokens: int = 0
    sensitivity_seq_len: int = 0
    sensitivity_units: int = 0
    sensitivity_schemes: int = 0
    sensitivity_raised: int = 0


def sensitivity_forwards(m: Model, w: ConvertWork) -> int:
    """Forward passes of the sensitivity pass: 1 reference and 2 for its noise floor, every unit
    at the base scheme, and the raised units at each choice and once for their own noise check."""
    if not w.sensitivity_tokens:
        return 0
    return 3 + w.sensitivity_units * m.layers + w.sensitivity_raised * w.sensitivity_schemes


def sensitivity_flops(m: Model, w: ConvertWork) -> float:
    """The reference and the noise floor's two forwards run every layer and the head; a unit's
    forward at layer i runs the last L - i layers and the head (sensitivity.Reference): summed
    over the layers, L heads and L(L+1)/2 layers per unit at the base; a raised unit's forwards
    are counted at the average layer's cost (which layers a budget raises is known once measured)."""
    if not w.sensitivity_tokens:
        return 0.0
    full = forward_flops(m, w.sensitivity_tokens, w.sensitivity_seq_len, with_head=True)
    layers = forward_flops(m, w.sensitivity_tokens, w.sensitivity_seq_len)
    per_layer, head = layers / m.layers, full - layers
    base = w.sensitivity_units * (m.layers * head + per_layer * m.layers * (m.layers + 1) / 2)
    return 3 * full + base + w.sensitivity_raised * w.sensitivity_schemes * (head + per_layer * (m.layers + 1) / 2)


def sensitivity_bytes(m: Model, w: ConvertWork) -> int:
    if not w.sensitivity_tokens:
        return 0
    return working_set_bytes(w.sensitivity_tokens, w.sensitivity_seq_len, m.vocab, m.hidden, m.layers, w.calib_itemsize)


def convert_plan(m: Model, w: ConvertWork, mc: Machine) -> Plan:
    # GQA keeps the model in float32 and, to recover, a bf16 teacher and a bf16 student beside it
    calib_model = m.params * (w.calib_itemsize + (4 if w.recover_tokens else 0))
    in_ram = min(calib_model, w.offload_cpu_bytes) if w.offload_cpu_bytes is not None else calib_model
    calibrating = (w.calibrates or w.gqa) and w.calib_tokens > 0
    cache = activation_bytes(m, w.calib_tokens, w.seq_len, w.calib_itemsize) if calibrating and w.layerwise else 0
    window = window_bytes(m, w.seq_len) if calibrating else 0
    layer = m.layer_linear_params * w.calib_itemsize
    gptq_ws = hessian_bytes(m) + solve_bytes(m) if w.hessians and calibrating else 0
    reload = min(m.params * m.itemsize, w.offload_cpu_bytes or m.params * m.itemsize)
    sens = sensitivity_bytes(m, w)
    stages = {
        "source": m.weight_bytes,
        "calibration_model": calib_model,
        "calibration_working_set": cache + window + gptq_ws,
        "artifact": w.artifact_bytes,
        "reload_check": reload,
    }
    if sens:
        stages["sensitivity_working_set"] = sens
    base = BASE_RSS["convert"]
    # Where things live: llm-compressor keeps the model in RAM and brings one layer (and its
    # GPTQ buffers) to the device; GQA and bitsandbytes hold the whole model there. On the CPU,
    # RAM is the device: a layer onloaded to it is the same memory.
    on_device = mc.device_type != "cpu"
    working = (layer if on_device else 0) + gptq_ws + window if w.layerwise else calib_model + window
    in_ram_calib = (in_ram + cache if w.layerwise else 0) + (0 if on_device else working)
    calib_peak = base + in_ram_calib
    reload_peak = base + RELOAD_RETAINED * in_ram + reload + w.artifact_bytes
    # the sensitivity pass, before calibration: the whole model and the pass's working set, on the
    # device when both fit there (quantize/auto.pass_device), else in RAM
    sens_on_device = on_device and sens and calib_model + sens <= 0.9 * mc.device_free
    sens_peak = base + in_ram + (0 if sens_on_device else sens)
    peak_vram = int(max(working, calib_model + sens if sens_on_device else 0)) if on_device else None
    t = convert_time(m, w, mc)
    plan = Plan(
        "convert",
        model_dict(m),
        asdict(mc),
        stages,
        int(max(calib_peak, reload_peak, sens_peak)),
        peak_vram,
        w.disk_bytes,
        w.offload_cpu_bytes is not None,
        sum(t.values()),
        t,
    )
    if w.sensitivity_tokens:
        plan.notes.append(
            f"auto mixed precision: about {sensitivity_forwards(m, w)} forwards "
            f"of {w.sensitivity_tokens} tokens before "
            f"quantizing (1 reference + 2 for the noise floor + {w.sensitivity_units} units x {m.layers} layers at the "
            f"base, + {w.sensitivity_schemes - 1} "
            f"choice{'s' if w.sensitivity_schemes != 2 else ''} and a noise check for each of "
            f"the {w.sensitivity_raised} units "
            "the budget can raise at most; each from its unit's layer on), "
            f"{'on the device' if sens_on_device else 'in RAM'}"
        )
    check_fit(plan, mc, w)
    return plan


def convert_time(m: Model, w: ConvertWork, mc: Machine) -> dict:
    flops = mc.bf16_flops if w.calib_itemsize == 2 else mc.fp32_flops
    t = {
        "startup": STARTUP_S["convert"],
        "hash": m.weight_bytes / HASH_BPS if w.first_hash else 0.0,
        "load": m.weight_bytes / LOAD_BPS,
    }
    if (
        w.sensitivity_tokens
    ):  # each forward's float32 log-softmax and KL read and write ~6 copies of tokens x vocabulary
        t["sensitivity"] = (
            sensitivity_flops(m, w) / (flops * MATMUL_EFF)
            + sensitivity_forwards(m, w) * 24 * w.sensitivity_tokens * m.vocab / mc.read_bps
        )
    if w.gqa:
        t["statistics"] = forward_flops(m, w.calib_tokens, w.seq_len) / (flops * MATMUL_EFF)
        # a distillation step: the teacher's forward, the student's forward and backward (~3x a forward)
        train = 4 * forward_flops(m, w.recover_tokens, w.seq_len, with_head=True) / (mc.bf16_flops * MATMUL_EFF)
        t["recovery"] = min(train, w.recover_max_s) if w.recover_tokens else 0.0
    elif w.passes:
        t["calibration_forward"] = w.passes * forward_flops(m, w.calib_tokens, w.seq_len) / (flops * MATMUL_EFF)
        if w.hessians:
            t["hessians"] = hessian_flops(m, w.calib_tokens) / (mc.fp32_flops * MATMUL_EFF)
            t["gptq_solve"] = solve_flops(m) / (mc.fp32_flops * SOLVE_EFF) + m.layers * sum(
                c for _, c in m.layer_linears
            ) * COLUMN_S.get(mc.device_type, COLUMN_S["cpu"])
    else:
        t["quantize"] = m.params * w.calib_itemsize / (mc.read_bps * 0.05)  # observers and rounding: elementwise passes
    t["save"] = m.params * m.itemsize / SAVE_BPS
    t["reload_check"] = w.artifact_bytes / LOAD_BPS + m.params * m.itemsize / LOAD_BPS
    return {k: round(v, 1) for k, v in t.items()}


def check_fit(plan: Plan, mc: Machine, w: ConvertWork | None = None) -> None:
    if plan.peak_ram > mc.ram_available:
        plan.fits = False
        plan.problems.append(
            f"needs about {plan.peak_ram / GB:.1f} GB of RAM, {mc.ram_available / GB:.1f} GB available"
        )
        if w is not None and w.layerwise and w.offload_cpu_bytes is None:
            plan.advice.append(f"--max-memory {max(1, int(mc.ram_available * 0.5 / GB))}GB (offload weights to disk)")
        if w is not None and w.calib_tokens and plan.stages.get("calibration_working_set", 0) > 0.25 * mc.ram_available:
            plan.advice.append("fewer calibration samples (--set calibration.samples=N)")
    if plan.peak_vram is not None and plan.peak_vram > mc.device_free:
        plan.fits = False
        plan.problems.append(
            f"needs about {plan.peak_vram / GB:.1f} GB on {mc.device}, {mc.device_free / GB:.1f} GB free"
        )
        plan.advice.append("--device cpu, or a GPU with more memory")
        if w is not None and w.calib_tokens:
            plan.advice.append("fewer calibration samples (--set calibration.samples=N)")
    if plan.disk > mc.disk_free:
        plan.fits = False
        plan.problems.append(
            f"needs about {plan.disk / GB:.1f} GB of disk beside --out, {mc.disk_free / GB:.1f} GB free"
        )
        plan.advice.append("another --out on a disk with more space")
    if not plan.fits and not plan.advice:
        plan.advice.append("--device cuda (a GPU with enough memory) or a machine with more memory")


# ---------------------------------------------------------------- eval and bench


def window_vocab_bytes(seq_len: int, vocab: int, itemsize: int) -> int:
    """The vocabulary-sized arrays of one scored window at once: its logits in the model's dtype, a
    float32 copy where that dtype is 16-bit, their log-softmax, and four float32 arrays of
    KL_CHUNK positions (the exact KL's baseline rows, their exp and two products; the baseline
    pass's check of its output layer, a chunk at a time too). Measured at a 262,144 vocabulary,
    float32 on the CPU, peak RSS in process (resource.getrusage): 7.22 GB at 2,048 positions and
    3.99 GB at 512 for an INT4 artifact of a 16.9M-parameter model, against 7.34 and 4.1 GB."""
    rows = seq_len * vocab
    return rows * itemsize + (rows * 4 if itemsize != 4 else 0) + rows * 4 + 4 * min(seq_len, KL_CHUNK) * vocab * 4


def eval_plan(
    base: Model,
    model: Model,
    tokens: int,
    seq_len: int,
    itemsize: int,
    mc: Machine,
    model_bytes: int,
    first_hash: bool,
    same: bool = False,
    exact_kl: bool = False,
) -> Plan:
    """Baseline pass (cached afterwards), then the model's pass: each a forward with the LM head
    over every window; one window's float32 log-probabilities at a time. `same`: the model is the
    baseline, scored from the baseline pass alone. `exact_kl`: the baseline's rows are recomputed
    from its pass by its LM head beside the model (one matmul per position, a chunk at a time)."""
    dense_base, dense_model = base.params * itemsize, (0 if same else model.params * itemsize)
    logits = window_vocab_bytes(seq_len, base.vocab, itemsize)
    stages = {
        "source": base.weight_bytes,
        "baseline_loaded": dense_base,
        "model_on_disk": model_bytes,
        "model_loaded": dense_model,
        "window_logits": logits,
    }
    on_device = mc.device_type != "cpu"
    # the artifact's file is mapped while it loads, the window's logits exist while it runs: not both
    peak_ram = BASE_RSS["eval"] + (
        model_bytes if on_device else RETAINED * dense_base + dense_model + max(model_bytes, logits)
    )
    peak_vram = int(max(dense_base, dense_model) + logits) if on_device else None
    flops = mc.bf16_flops if itemsize == 2 else mc.fp32_flops
    fwd = forward_flops(base, tokens, seq_len, with_head=True) / (flops * MATMUL_EFF)
    t = {
        "startup": STARTUP_S["eval"],
        "hash": (base.weight_bytes + model_bytes) / HASH_BPS if first_hash else 0.0,
        "load": (base.weight_bytes + model_bytes) / LOAD_BPS + (dense_base + dense_model) / LOAD_BPS,
        "baseline_pass": fwd,
        "model_pass": 0.0 if same else fwd,
        "exact_kl": 2.0 * base.head[0] * base.head[1] * tokens / (flops * MATMUL_EFF) if exact_kl and not same else 0.0,
    }
    plan = Plan(
        "eval",
        model_dict(model),
        asdict(mc),
        stages,
        int(peak_ram),
        peak_vram,
        0,
        False,
        sum(t.values()),
        {k: round(v, 1) for k, v in t.items()},
    )
    check_fit(plan, mc)
    if not plan.fits and itemsize == 4:
        plan.advice.insert(0, "--dtype bfloat16 (half the memory)")
    return plan


@dataclass(frozen=True)
class BenchWork:
    prompt_len: int
    gen_len: int
    runs: int  # warm-ups + repeats
    bytes_per_token: tuple[float, ...]  # each model's decode bytes (roofline)
    loaded_bytes: tuple[int, ...]  # each model's weights as the engine holds them
    compile_s: float  # per model: torch.compile's first call (0 for eager)
    prefill_flops: tuple[float, ...]  # each model's prompt forward
    reference_bytes: tuple[int, ...] = ()  # the self-check's reference load of each checkpoint (0: none)
    # --depth: decode after each depth's one prefill (bench/harness.py measure_depth)
    depths: tuple[int, ...] = ()
    depth_prefill_flops: tuple[tuple[float, ...], ...] = ()  # each model's prefill of each depth (roofline)
    kv_bytes: tuple[float, ...] = ()  # each model's KV bytes per cached token
    min_seconds: float = 0.0  # a shallow depth's prefill is timed again while its samples sum to less
    ttft_samples: int = 1  # at most this many prefills per depth
    loads: int = 1  # --flash-attn both: each model is loaded and measured twice
    anchored: bool = False  # the engine's own benchmark (llama-bench) runs at each depth too
    # the attribution (bench/twin_timing.py): the twin's prefills of its cache sizes, once per load
    # setting (models of one geometry share it), and each model's weights through its kernels
    twin_prefill_flops: float = 0.0
    twin_sizes: int = 2  # the cache sizes the twin decodes at
    attributes: bool = False

    @property
    def max_tokens(self) -> int:
        return max((self.prompt_len, *self.depths)) + self.gen_len


def probe_bytes(device_type: str) -> tuple[int, int]:
    """(RAM, device memory) of the device probe's process at its peak (PROBE_BASE_RSS)."""
    n = probe.MATMUL_N["cuda" if device_type == "cuda" else "cpu"]
    arrays = 2 * probe.buffer_bytes() + 2 * n * n * 4  # float32: the largest of its matmul dtypes
    on_device = device_type != "cpu"
    return int(PROBE_BASE_RSS + (0 if on_device else arrays)), (arrays if on_device else 0)


def bench_plan(m: Model, w: BenchWork, mc: Machine) -> Plan:
    """Models are benchmarked one after another: the peak is the largest one loaded; the time is
    each one's load, its warm-ups and repeats of a prefill and `gen_len` decode steps."""
    largest = max(w.loaded_bytes)
    kv = 2 * m.layers * m.q_dim * w.max_tokens * 2
    on_device = mc.device_type != "cpu"
    # the self-check's reference, on the bench's device before the engine loads: float32 where it
    # takes under a third of the free memory, else bfloat16 (bench/selfcheck.reference_dtype); on
    # the CPU beside the mapped checkpoint file (measured at 0.5B/1.2B: 0.95x of base + file +
    # float32 copy; benchmarks/scale.py)
    refs = [
        r if reference_in_float32(r, mc.device_free) else r // 2
        for r in (w.reference_bytes or (0,) * len(w.loaded_bytes))
    ]
    compiling = COMPILE_RSS if w.compile_s else 0
    held = max(max(loaded + ref, (1 + RETAINED) * loaded + kv + compiling) for loaded, ref in zip(w.loaded_bytes, refs))
    probe_ram, probe_vram = probe_bytes(mc.device_type)
    peak_ram = max(BASE_RSS["bench"] + (0 if on_device else held), probe_ram)  # the probe runs before and after
    t = {"startup": STARTUP_S["bench"], "probes": 2 * PROBE_S}
    for i, (b, loaded, fl, ref) in enumerate(zip(w.bytes_per_token, w.loaded_bytes, w.prefill_flops, refs)):
        prefill = fl / (mc.bf16_flops * MATMUL_EFF)
        if w.depths:  # the self-check's prefill per load, then each depth (depth_seconds)
            compile_s = w.compile_s + (DEPTH_COMPILE_S * (len(w.depths) - 1) if w.compile_s else 0.0)
            t[f"model_{i}"] = round(ref / LOAD_BPS + w.loads * (loaded / LOAD_BPS + compile_s + prefill), 1)
            for d, flops in zip(w.depths, w.depth_prefill_flops[i]):
                t[f"model_{i}_depth_{d}"] = round(w.loads * depth_seconds(w, mc, b, w.kv_bytes[i], d, flops), 1)
            continue
        decode = w.gen_len * b / (mc.read_bps * DECODE_EFF)
        t[f"model_{i}"] = round(
            (loaded + ref) / LOAD_BPS + w.compile_s + (w.runs + (1 if ref else 0)) * prefill + w.runs * decode, 1
        )
    if w.attributes:
        t["attribution"] = round(attribution_seconds(w, mc), 1)
    plan = Plan(
        "bench",
        model_dict(m),
        asdict(mc),
        {"largest_loaded": largest, "kv_cache": kv, "reference": max(refs), "device_probe": probe_ram + probe_vram},
        int(peak_ram),
        int(max(largest + kv, max(refs), probe_vram)) if on_device else None,
        0,
        False,
        sum(t.values()),
        t,
    )
    check_fit(plan, mc)
    return plan


KERNEL_PASSES = 6  # the kernel probe's passes over every weight (at least; bench/weight_timing.py)


def attribution_seconds(w: BenchWork, mc: Machine) -> float:
    """The attribution's measurements: per load setting the twin (its prefills, attention at the
    probed matmul rate, and each cache size's decode runs; an engine that compiles compiles the
    twin at each size), per model and load the passes of its kernels over its weights."""
    twin = w.twin_prefill_flops / (mc.bf16_flops * MATMUL_EFF) + w.twin_sizes * w.runs * w.gen_len * 0.005
    twin += w.twin_sizes * w.compile_s if w.compile_s else 0.0
    kernels = sum(KERNEL_PASSES * b / (mc.read_bps * DECODE_EFF) + 0.25 for b in w.bytes_per_token)
    return w.loads * (twin + kernels)


def depth_prefill_s(mc: Machine, weight_bytes: float, kv: float, depth: int, flops: float) -> float:
    """The prefill of `depth` tokens: the roofline's TTFT (roofline.predict_ttft_s) at the probed
    rates, the matmul rate at the share layer forwards reach."""
    if depth == 0:
        return 0.0
    return predict_ttft_s(flops, mc.bf16_flops * MATMUL_EFF, weight_bytes + kv * depth, mc.read_bps)


def depth_seconds(w: BenchWork, mc: Machine, weight_bytes: float, kv: float, depth: int, flops: float) -> float:
    """One depth of one load: its prefill as many times as the harness times it (harness.prefill_samples),
    the warm-ups and repeats of gen_len - 1 decode steps over the weights and the depth's K/V, and
    llama-bench's own prefill of the depth and its repetitions where the engine runs it."""
    prefill = depth_prefill_s(mc, weight_bytes, kv, depth, flops)
    samples = prefill_samples(prefill, w.min_seconds, w.ttft_samples) if depth else 0
    step = (weight_bytes + kv * (depth + w.gen_len / 2)) / (mc.read_bps * DECODE_EFF)
    out = samples * prefill + w.runs * (w.gen_len - 1) * step
    if w.anchored:  # llama-bench: one prefill of the depth (restored before each repetition), then its steps
        out += prefill + w.runs * w.gen_len * step
    return out


def combine(command: str, plans: list[Plan]) -> Plan:
    """`run`: steps one after another: times add up, the peak is the largest step's."""
    first = plans[0]
    vram = [p.peak_vram for p in plans if p.peak_vram is not None]
    out = Plan(
        command,
        first.model,
        first.machine,
        {f"{p.command}:{i}": p.peak_ram for i, p in enumerate(plans)},
        max(p.peak_ram for p in plans),
        max(vram) if vram else None,
        sum(p.disk for p in plans),
        any(p.offload for p in plans),
        sum(p.seconds for p in plans),
        {f"{i}:{p.command}": round(p.seconds, 1) for i, p in enumerate(plans)},
    )
    out.fits = all(p.fits for p in plans)
    for p in plans:
        out.problems += [f"{p.command}: {x}" for x in p.problems]
        out.advice += [a for a in p.advice if a not in out.advice]
    out.notes = [n for p in plans for n in p.notes]
    return out


def model_dict(m: Model) -> dict:
    return {
        "params": m.params,
        "weight_bytes": m.weight_bytes,
        "layers": m.layers,
        "hidden": m.hidden,
        "vocab": m.vocab,
        "linear_params": m.layers * m.layer_linear_params,
    }
