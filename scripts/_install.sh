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
want=$(cat pyproject.toml setup.py scripts/_install.sh scripts/build_llama_tools.sh scripts/build_llama_wheel.sh | sha256sum | cut -c1-16)
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

pending=.venv/.quantkit-llamacpp-building  # a llama-cpp-python build running in the background: its pid and log
LLAMA_CPP_VERSION=0.3.36
wheelhouse=${QUANTKIT_WHEELHOUSE:-$HOME/.cache/quantkit/wheels}
WHEEL_CPU_SECONDS=420  # the full wheel's compile, measured (2 idle cores: 3.5 min)
minutes=$(( (WHEEL_CPU_SECONDS / $(nproc) + 59) / 60 ))
installed() { .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llama_cpp') is None)"; }
started_here=0
# The quickstart's llama.cpp (QUANTKIT_LLAMACPP_BACKGROUND=1: no tools asked or built) compiles in the
# background from the moment .venv can run pip, beside the installs (mostly unpacking) and the demo's
# torch steps; the caller's next call waits for it and installs it.
background_build() {
  [ "${QUANTKIT_LLAMACPP_BACKGROUND:-0}" = 1 ] && [ "${QUANTKIT_SKIP_LLAMACPP:-0}" != 1 ] \
    && [ "${QUANTKIT_WITH_LLAMA_TOOLS:-0}" != 1 ] && [ ! -f .venv/.quantkit-llama-tools ] && [ ! -f "$pending" ] \
    && ! installed && ! bash scripts/build_llama_wheel.sh --built "$LLAMA_CPP_VERSION" "$wheelhouse" full || return 0
  log=$(mktemp)
  echo "==> building llama-cpp-python $LLAMA_CPP_VERSION in the background (compiles llama.cpp once: about $minutes min of $(nproc) idle cores, at the lowest priority, so it takes what the other steps leave; log: $log)"
  # nice 19: the compile never starves the torch steps (their threads wait for each other, so a core
  # taken from one stalls all), it fills the gaps they leave and has the machine once they are done
  nohup nice -n 19 bash scripts/build_llama_wheel.sh "$LLAMA_CPP_VERSION" "$wheelhouse" full .venv/bin/python >"$log" 2>&1 &
  echo "$! $log" > "$pending"
  started_here=1
}
if [ ! -f "$pending" ]; then  # else an earlier call installed the rest and left llama.cpp building
echo "==> installing quantkit into .venv (first run takes a few minutes)"
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
background_build
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
fi
# llama.cpp. Its own tools (llama-server, llama-bench, llama-quantize, llama-imatrix,
# llama-perplexity) are built where the caller asks for them (test.sh: QUANTKIT_WITH_LLAMA_TOOLS=1),
# once per machine, into the wheelhouse (scripts/build_llama_tools.sh: CPU code chosen at run time,
# never -march=native); where they are goes beside the stamp, for quantkit (quantkit/gguf/tools.py)
# and the tests. They come first: llama-cpp-python then installs as its Python package alone and
# runs the tools' libllama, one llama.cpp build for both. Without them, llama-cpp-python compiles
# its own (PyPI carries only its source: 3-8 minutes on 2 cores, once; the wheel is kept in the
# wheelhouse). QUANTKIT_SKIP_LLAMA_TOOLS=1 (or QUANTKIT_SKIP_LLAMACPP=1) leaves the tools out on
# purpose, as a file beside the stamp records; QUANTKIT_SKIP_LLAMACPP=1 leaves llama.cpp out
# entirely (quantkit works without it; `--engine llamacpp` then says how to install it).
# vLLM's environment (below) is mostly downloading and unpacking 2.5 GB, the tools' build is compiling:
# where both are to be built, vLLM's goes in the background first, beside the compile, and is waited for below.
vllm_job=
if [ "${QUANTKIT_WITH_VLLM:-0}" = 1 ] && [ "${QUANTKIT_SKIP_VLLM:-0}" != 1 ] && [ -z "${QUANTKIT_VLLM_VENV:-}" ] \
    && [ "${QUANTKIT_WITH_LLAMA_TOOLS:-0}" = 1 ] && [ "${QUANTKIT_SKIP_LLAMA_TOOLS:-0}" != 1 ] \
    && [ "${QUANTKIT_SKIP_LLAMACPP:-0}" != 1 ] && ! bash scripts/build_llama_tools.sh --built "$LLAMA_CPP_VERSION" "$wheelhouse"; then
  vllm_log=$(mktemp)
  echo "==> building vLLM's environment in the background, beside llama.cpp's compile (log: $vllm_log)"
  .venv/bin/quantkit engines install vllm >"$vllm_log" 2>&1 &
  vllm_job=$!
fi
if [ "${QUANTKIT_SKIP_LLAMACPP:-0}" = 1 ] || [ "${QUANTKIT_SKIP_LLAMA_TOOLS:-0}" = 1 ]; then
  rm -f .venv/.quantkit-llama-tools
  touch .venv/.quantkit-without-llama-tools
elif [ "${QUANTKIT_WITH_LLAMA_TOOLS:-0}" = 1 ]; then
  if ! tools=$(bash scripts/build_llama_tools.sh "$LLAMA_CPP_VERSION" "$wheelhouse" .venv/bin/python); then
    echo "install failed: llama.cpp's tools did not build; set QUANTKIT_SKIP_LLAMA_TOOLS=1 to install without them" >&2
    exit 1
  fi
  echo "${tools##*$'\n'}" > .venv/.quantkit-llama-tools
  rm -f .venv/.quantkit-without-llama-tools
fi
if [ "${QUANTKIT_SKIP_LLAMACPP:-0}" != 1 ] && ! installed; then
  kind=full
  [ -f .venv/.quantkit-llama-tools ] && kind=nolib
  if [ -f "$pending" ] && [ "$started_here" = 0 ]; then  # started by an earlier call (the quickstart's first): wait for it
    read -r pid log < "$pending"
    if kill -0 "$pid" 2>/dev/null; then
      echo "==> waiting for llama.cpp's build, started in the background (log: $log)"
      while kill -0 "$pid" 2>/dev/null; do sleep 2; done
    fi
    rm -f "$pending"
  fi
  background_build  # where the early start did not apply (an import that failed since, say)
  if [ ! -f "$pending" ]; then  # else it builds in the background: the next call installs it
    [ "$kind" = full ] && ! bash scripts/build_llama_wheel.sh --built "$LLAMA_CPP_VERSION" "$wheelhouse" full \
      && echo "==> building llama-cpp-python $LLAMA_CPP_VERSION (compiles llama.cpp once: about $minutes min on $(nproc) idle cores; the wheel is kept in $wheelhouse)"
    if ! whl=$(bash scripts/build_llama_wheel.sh "$LLAMA_CPP_VERSION" "$wheelhouse" "$kind" .venv/bin/python); then
      echo "install failed: llama-cpp-python did not build; set QUANTKIT_SKIP_LLAMACPP=1 to install without llama.cpp" >&2
      exit 1
    fi
    .venv/bin/python -m pip install -q "${whl##*$'\n'}[server]" 2>&1 | grep -v "^WARNING: Location" || true
  fi
fi
# The tests take everything this script installs as present (tests/installed.py): a missing
# llama_cpp fails them, unless it was left out on purpose (as this file records) or is still building.
if [ "${QUANTKIT_SKIP_LLAMACPP:-0}" = 1 ]; then
  touch .venv/.quantkit-without-llamacpp
elif [ ! -f "$pending" ]; then
  rm -f .venv/.quantkit-without-llamacpp
  # imports through quantkit: it points llama-cpp-python at the library to run and tries that
  # library's CPU variants on this machine first (quantkit/gguf/cpu_variant.py)
  .venv/bin/python -c "from quantkit.bench.engines.llamacpp_engine import import_llama_cpp; import_llama_cpp()" >/dev/null \
    || { echo "install failed: llama-cpp-python does not load; set QUANTKIT_SKIP_LLAMACPP=1 to install without llama.cpp" >&2; exit 1; }
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
  if [ -n "$vllm_job" ]; then  # started above, beside the tools' compile
    echo "==> waiting for vLLM's environment (log: $vllm_log)"
    if ! wait "$vllm_job"; then
      tail -3 "$vllm_log" >&2
      echo "install failed: vLLM's environment did not build; set QUANTKIT_SKIP_VLLM=1 to install without vLLM" >&2
      exit 1
    fi
  elif [ -z "${QUANTKIT_VLLM_VENV:-}" ] && ! .venv/bin/quantkit engines install vllm; then
    echo "install failed: vLLM's environment did not build; set QUANTKIT_SKIP_VLLM=1 to install without vLLM" >&2
    exit 1
  fi
  .venv/bin/python -c "from quantkit.external.vllm_env import location; print(location()[0])" > .venv/.quantkit-vllm
  rm -f .venv/.quantkit-without-vllm
fi
.venv/bin/python -c "import quantkit, torch, transformers, llmcompressor" 2>/dev/null \
  || { echo "install failed: quantkit or one of its libraries does not import" >&2; exit 1; }
if [ -f "$pending" ]; then  # llama.cpp still building: the next call waits for it, installs it and stamps
  exit 0
fi
echo "$want" > "$stamp"
