#!/usr/bin/env bash
# Build llama-cpp-python VERSION's wheel once into DIR/KIND and print its path on the last line.
#
#   scripts/build_llama_wheel.sh VERSION DIR KIND [PYTHON]
#   scripts/build_llama_wheel.sh --built VERSION DIR KIND   # exit 0 when that wheel is there (nothing is built)
#
# The wheel is kept in DIR/KIND-KEY, KEY hashing the CMake arguments: other flags build anew.
# KIND full: the wheel compiles its own libllama (PyPI carries only the source): portable CPU flags
# (AVX2 level, never -march=native: a native build died with an illegal instruction on another CPU
# of the same workplace), without the multimodal library (mtmd), which quantkit never loads.
# KIND nolib: the Python package alone (seconds), for an install that also built llama.cpp's tools
# (scripts/build_llama_tools.sh): quantkit points llama-cpp-python at the tools' libllama, so one
# llama.cpp build serves the library and the tools.
#
# pip's own cache is bypassed: it keys a built wheel by the source, not by CMAKE_ARGS, and would hand
# one kind's wheel to the other.
set -euo pipefail
check_only=0
if [ "${1:-}" = --built ]; then check_only=1; shift; fi
VERSION=${1:?usage: build_llama_wheel.sh VERSION DIR KIND [PYTHON]}
DIR=${2:?usage: build_llama_wheel.sh VERSION DIR KIND [PYTHON]}
KIND=${3:?usage: build_llama_wheel.sh VERSION DIR KIND [PYTHON]}
PY=${4:-python3}
case "$KIND" in
  full) args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" ;;
  nolib) args="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" ;;
  *) echo "KIND must be full or nolib" >&2; exit 2 ;;
esac
dest="$DIR/$KIND-$(printf '%s' "$args" | sha256sum | cut -c1-12)"
whl=$(find "$dest" -maxdepth 1 -name "llama_cpp_python-$VERSION-*.whl" -print -quit 2>/dev/null || true)
if [ -n "$whl" ]; then
  [ "$check_only" = 1 ] || echo "$whl"
  exit 0
fi
[ "$check_only" = 0 ] || exit 1
mkdir -p "$dest"
stage=$(mktemp -d "$dest/.build.XXXXXX")
log="$stage/build.log"
trap 'rm -rf "$stage"' EXIT
start=$(date +%s)
if ! CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip wheel --no-cache-dir --no-deps \
    "llama-cpp-python==$VERSION" -w "$stage" >"$log" 2>&1; then
  cp "$log" "$DIR/llama-cpp-python-$KIND-build.log"
  echo "llama-cpp-python failed to build (log: $DIR/llama-cpp-python-$KIND-build.log)" >&2
  exit 1
fi
built=$(find "$stage" -maxdepth 1 -name "llama_cpp_python-$VERSION-*.whl" -print -quit)
mv "$built" "$dest/"
echo "==> llama-cpp-python $VERSION ($KIND) built in $(( $(date +%s) - start )) s" >&2
echo "$dest/$(basename "$built")"
