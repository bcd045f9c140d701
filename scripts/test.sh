#!/usr/bin/env bash
# Install (as quickstart.sh does, plus vLLM's environment), check the wheel a user would install, then run the test suite.
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m "not slow" for the quick suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
QUANTKIT_WITH_VLLM=1 QUANTKIT_WITH_LLAMA_TOOLS=1 bash scripts/_install.sh  # the tests run vLLM and llama.cpp's tools too: each built once
bash scripts/wheel_smoke.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
