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
want=$(cat pyproject.toml scripts/_install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import quantkit" 2>/dev/null; then
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
.venv/bin/python -c "import quantkit, torch, transformers, llmcompressor" 2>/dev/null \
  || { echo "install failed: quantkit or one of its libraries does not import" >&2; exit 1; }
echo "$want" > "$stamp"
