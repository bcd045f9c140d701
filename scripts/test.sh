#!/usr/bin/env bash
# Install (as quickstart.sh does, plus vLLM's environment and llama.cpp's tools), lint, check the wheel
# a user would install, then run the test suite on every core (pytest-xdist; QUANTKIT_TEST_WORKERS
# overrides, 0 runs it in this process) and print its slowest tests.
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m "not slow" for the quick suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
QUANTKIT_WITH_VLLM=1 QUANTKIT_WITH_LLAMA_TOOLS=1 bash scripts/_install.sh  # the tests run vLLM and llama.cpp's tools too: each built once
.venv/bin/ruff format --check --quiet quantkit tests benchmarks scripts
.venv/bin/ruff check --quiet quantkit tests benchmarks scripts
bash scripts/wheel_smoke.sh
# a test file runs in one worker (its module fixtures are built once); the slowest 25 are listed
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${QUANTKIT_TEST_WORKERS:-auto}" --dist loadfile \
  --durations=25 "$@"
