#!/usr/bin/env bash
# Every GPU check in one prepared script, sized for < 8 minutes on one H200; prints a short table.
# NOT RUN YET: the sessions so far had no GPU (see docs/PERFORMANCE.md). On the lent H200 the
# image has torch, transformers, accelerate, click, rich, psutil, matplotlib, safetensors and
# numpy; quantkit's bench path needs nothing else (synthetic shapes need no llm-compressor).
#   device run:  bash scripts/gpu_check.sh      (writes $OUT/*.json and PNGs when OUT is set)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 QUANTKIT_HOME="${QUANTKIT_HOME:-/tmp/qk-home}"
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/qk-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true

# 1. the device: copy/read bandwidth and bf16 matmul rate
$PY -m quantkit bench --probe --device cuda --json > "$OUT/probe.json"
# 2. Llama-3-8B-shaped synthetic model: bf16, int8 and int4 weight-only, compiled (CUDA graphs)
$PY -m quantkit bench --shape llama3-8b --shape-bits 16,8,4 --device cuda --engine compiled \
    --prompt-len 256 --gen-len 128 --repeats 5 --min-seconds 3 --sweep 128,512,2048 \
    --out "$OUT/bench-llama3-8b.json" --plot "$OUT/rule-llama3-8b.png" --json > /dev/null
# 3. the same in eager mode, to show what launch overhead costs
$PY -m quantkit bench --shape llama3-8b --shape-bits 16 --device cuda --engine eager \
    --prompt-len 256 --gen-len 32 --repeats 3 --min-seconds 0 --out "$OUT/bench-llama3-8b-eager.json" --json > /dev/null

$PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
p = json.load(open(f"{out}/probe.json"))
print(f"\n{p['name']}: read {p['read_gbps']:.0f} GB/s, copy {p['copy_gbps']:.0f} GB/s, bf16 matmul {p['bf16_matmul_tflops']:.0f} TFLOP/s")
for f in ("bench-llama3-8b", "bench-llama3-8b-eager"):
    r = json.load(open(f"{out}/{f}.json"))
    base = r["rows"][0]["tpot_ms"]
    d = r["device"]
    print(f"\n{f} (engine {r['settings']['engine']}, {d['device']} {d.get('device_name')}, {d.get('dtype')}); fit: {r['fit']}")
    if d.get("drift"):
        print(f"probe drift before/after the timings: {d['drift']['change']} (flagged: {d['drift']['flagged']})")
    print(f"{'variant':<34} {'GB/token':>9} {'TTFT ms':>8} {'TPOT ms':>8} {'pred ms':>8} {'eff':>5} {'x bf16':>7}  kernel")
    for row in r["rows"]:
        print(f"{row['name']:<34} {row['bytes_per_token']/1e9:>9.2f} {row['ttft_ms']:>8.1f} {row['tpot_ms']:>8.2f} "
              f"{row['predicted_tpot_ms']:>8.2f} {row['tpot_efficiency']*100:>4.0f}% {base/row['tpot_ms']:>6.2f}x  {row['kernel']}")
PY
