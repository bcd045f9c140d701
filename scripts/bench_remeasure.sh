#!/usr/bin/env bash
# Re-measure the bench figures of docs/PERFORMANCE.md that issue 15 A changed (TTFT floor and
# efficiency, the compiled engine's KV bytes, the probe's spread and drift, the self-check), in
# one quiet window. Each step takes the shared CPU lock (or hold it for all of them:
#   flock /tmp/qk-cpu.lock env LOCK_CMD= ./scripts/bench_remeasure.sh); ~15 minutes on 2 cores.
#   ART=runs/demo/artifacts ./scripts/bench_remeasure.sh      (artifacts from ./scripts/quickstart.sh)
# Without ART, the demo's RTN INT8 (per channel) and INT4 (g64) artifacts are converted into $OUT
# (same kernels and bytes as the GPTQ ones; ~1 minute each).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qk-remeasure}
QK=.venv/bin/quantkit
LOCK=${LOCK_CMD-flock /tmp/qk-cpu.lock}  # LOCK_CMD= when the caller already holds the lock for the whole run
mkdir -p "$OUT"
if [[ -n "${ART:-}" ]]; then
  INT8="$ART/int8-gptq"; INT4="$ART/int4-gptq-g64"
else
  INT8="$OUT/int8-rtn"; INT4="$OUT/int4-rtn-g64"
  [[ -d $INT4 ]] || $LOCK $QK convert recipes/int4-w4a16-rtn.yaml --model demo --out "$INT4" --json > /dev/null
  printf 'description: INT8 weights per output channel (W8A16), round-to-nearest, symmetric\nsteps:\n  - quantize:\n      method: rtn\n      bits: 8\n      group_size: -1\n      symmetric: true\n' > "$OUT/int8-w8a16-rtn.yaml"
  [[ -d $INT8 ]] || $LOCK $QK convert "$OUT/int8-w8a16-rtn.yaml" --model demo --out "$INT8" --json > /dev/null
fi
uptime
# 1. the demo suite on the compiled engine: TPOT/TTFT, efficiency, fit, sweep, self-check, probe before/after
$LOCK $QK bench demo "$INT8" "$INT4" --engine compiled --prompt-len 256 --gen-len 64 --repeats 3 --min-seconds 2 \
    --sweep 64,128,256,512 --out "$OUT/compiled.json" --plot "$OUT/rule-compiled.png" --md | tee "$OUT/compiled.md"
# 2. the same on the eager engine (dynamic cache), the same minute's conditions
$LOCK $QK bench demo "$INT8" "$INT4" --engine eager --prompt-len 256 --gen-len 64 --repeats 3 --min-seconds 2 \
    --out "$OUT/eager.json" --md | tee "$OUT/eager.md"
# 3. the compiled engine's KV read before/after A2, at a 1k context, 3 and 1 KV heads
$LOCK .venv/bin/python scripts/bench_kv_read.py --prompt-len 1024 --gen-len 32 --sweep-max 2048 --json "$OUT/kv-read.json" | tee "$OUT/kv-read.md"
uptime
