#!/usr/bin/env bash
# Shared by quickstart.sh and test.sh: create or reuse .venv at the repo root and install
# quantkit into it. Idempotent: a stamp of the inputs skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi

stamp=.venv/.quantkit-install
want=$(cat pyproject.toml scripts/_install.sh scripts/build_llama_tools.sh | sha256sum | cut -c1-16)
# vLLM's environment is built where the caller asks for it (test.sh: QUANTKIT_WITH_VLLM=1); the
# quickstart does not need it.
vllm_ready() {  # not asked for, left out on purpose, or the environment the last run recorded is still there
  [ "${QUANTKIT_WITH_VLLM:-0}" != 1 ] || [ -f .venv/.quantkit-without-vllm ] \
    || { [ -f .venv/.quantkit-vllm ] && [ -x "$(cat .venv/.quantkit-vllm)/bin/python" ]; }
}
tools_ready() {  # as vllm_ready, for llama.cpp's tools (test.sh: QUANTKIT_WITH_LLAMA_TOOLS=1)
  [ "${QUANTKIT_WITH_LLAMA_TOOLS:-0}" != 1 ] || [ -f .venv/.quantkit-without-llama-tools ] \
    || { [ -f .venv/.quantkit-llama-tools ] && [ -f "$(cat .venv/.quantkit-llama-tools)/BUILD.json" ]; }
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import quantkit" 2>/dev/null && vllm_ready && tools_ready; then
  exit 0
fi

echo "==> installing quantkit into .venv (first run takes a few minutes)"
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# torch first, pinned: the CPU build of 2.13.0 lies on this machine's disk, and a looser pin
# would make pip fetch a multi-GB CUDA build. A GPU user installs the torch of their platform
# into .venv before running this script; an importable torch is kept as it is.
# On a machine without an NVIDIA GPU and without the wheel at hand (pip's find-links), the CPU
# build comes from PyTorch's CPU index: PyPI's Linux wheel is the CUDA one.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  wheels=$(mktemp -d)
  if .venv/bin/python -m pip download -q --no-index --no-deps "torch==2.13.0" -d "$wheels" 2>/dev/null; then
    .venv/bin/python -m pip install -q "$wheels"/torch-*.whl  # the local wheel; its dependencies from the index
  elif command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
  else
    .venv/bin/python -m pip install -q "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
  rm -rf "$wheels"
fi
.venv/bin/python -m pip install -q -e ".[dev,serve]" 2>&1 | grep -v "^WARNING: Location" || true
# llama.cpp, through llama-cpp-python: PyPI carries only its source, which compiles llama.cpp
# (8-25 minutes on 2 cores). The wheel is built once into a wheelhouse outside the repo and reused
# by every later install. Portable CPU flags (AVX2 level, no -march=native): a native build died
# with an illegal instruction on another CPU of the same workplace. QUANTKIT_SKIP_LLAMACPP=1 skips
# it (quantkit works without it; `--engine llamacpp` then says how to install it).
LLAMA_CPP_VERSION=0.3.36
if [ "${QUANTKIT_SKIP_LLAMACPP:-0}" != 1 ] && ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  wheelhouse=${QUANTKIT_WHEELHOUSE:-$HOME/.cache/quantkit/wheels}
  mkdir -p "$wheelhouse"
  whl=$(find "$wheelhouse" -maxdepth 1 -name "llama_cpp_python-$LLAMA_CPP_VERSION-*.whl" -print -quit)
  if [ -z "$whl" ]; then
    echo "==> building llama-cpp-python $LLAMA_CPP_VERSION (compiles llama.cpp once, 8-25 minutes; the wheel is kept in $wheelhouse)"
    log=$(mktemp)
    if ! CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) .venv/bin/python -m pip wheel --no-deps "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$wheelhouse" >"$log" 2>&1; then
      echo "llama-cpp-python failed to build (log: $log); set QUANTKIT_SKIP_LLAMACPP=1 to install without llama.cpp" >&2
      exit 1
    fi
    rm -f "$log"
    whl=$(find "$wheelhouse" -maxdepth 1 -name "llama_cpp_python-$LLAMA_CPP_VERSION-*.whl" -print -quit)
  fi
  .venv/bin/python -m pip install -q "${whl}[server]" 2>&1 | grep -v "^WARNING: Location" || true
fi
# The tests take everything this script installs as present (tests/installed.py): a missing
# llama_cpp fails them, unless it was left out on purpose, as this file records.
if .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  rm -f .venv/.quantkit-without-llamacpp
else
  [ "${QUANTKIT_SKIP_LLAMACPP:-0}" = 1 ] || { echo "install failed: llama-cpp-python does not import; set QUANTKIT_SKIP_LLAMACPP=1 to install without llama.cpp" >&2; exit 1; }
  touch .venv/.quantkit-without-llamacpp
fi
# llama.cpp's own tools (llama-server, llama-bench, llama-quantize, llama-imatrix, llama-perplexity),
# built where the caller asks for them (test.sh: QUANTKIT_WITH_LLAMA_TOOLS=1) from the llama.cpp the
# wheel above vendors, once per machine, into the same wheelhouse (scripts/build_llama_tools.sh: CPU
# code chosen at run time, never -march=native). Where they are goes beside the stamp, for quantkit
# (quantkit/gguf/tools.py) and the tests; QUANTKIT_SKIP_LLAMA_TOOLS=1 (or QUANTKIT_SKIP_LLAMACPP=1)
# leaves them out on purpose, as this file records.
if [ "${QUANTKIT_SKIP_LLAMACPP:-0}" = 1 ] || [ "${QUANTKIT_SKIP_LLAMA_TOOLS:-0}" = 1 ]; then
  rm -f .venv/.quantkit-llama-tools
  touch .venv/.quantkit-without-llama-tools
elif [ "${QUANTKIT_WITH_LLAMA_TOOLS:-0}" = 1 ]; then
  if ! tools=$(bash scripts/build_llama_tools.sh "$LLAMA_CPP_VERSION" "${QUANTKIT_WHEELHOUSE:-$HOME/.cache/quantkit/wheels}" .venv/bin/python); then
    echo "install failed: llama.cpp's tools did not build; set QUANTKIT_SKIP_LLAMA_TOOLS=1 to install without them" >&2
    exit 1
  fi
  echo "${tools##*$'\n'}" > .venv/.quantkit-llama-tools
  rm -f .venv/.quantkit-without-llama-tools
fi
# vLLM, in an environment of its own (its pins clash with quantkit's: vLLM CPU 0.32 pins
# compressed-tensors 0.17, quantkit uses 0.19): `quantkit engines install vllm` builds it once under
# QUANTKIT_HOME, outside the repo (2.5 GB, a few minutes; the CUDA build where nvidia-smi answers),
# and finds it there on every later run. QUANTKIT_SKIP_VLLM=1 skips it (quantkit works without it;
# `--engine vllm` then says how to install it); QUANTKIT_VLLM_VENV names an environment made by hand.
# Where it is goes beside the stamp, for the tests (tests/installed.py), as llama.cpp's absence does.
if [ "${QUANTKIT_SKIP_VLLM:-0}" = 1 ]; then
  rm -f .venv/.quantkit-vllm
  touch .venv/.quantkit-without-vllm
elif [ "${QUANTKIT_WITH_VLLM:-0}" = 1 ]; then
  if [ -z "${QUANTKIT_VLLM_VENV:-}" ] && ! .venv/bin/quantkit engines install vllm; then
    echo "install failed: vLLM's environment did not build; set QUANTKIT_SKIP_VLLM=1 to install without vLLM" >&2
    exit 1
  fi
  .venv/bin/python -c "from quantkit.external.vllm_env import location; print(location()[0])" > .venv/.quantkit-vllm
  rm -f .venv/.quantkit-without-vllm
fi
.venv/bin/python -c "import quantkit, torch, transformers, llmcompressor" 2>/dev/null \
  || { echo "install failed: quantkit or one of its libraries does not import" >&2; exit 1; }
echo "$want" > "$stamp"
