#!/usr/bin/env bash
# Build llama.cpp's own tools (llama-server, llama-bench, llama-quantize, llama-imatrix,
# llama-perplexity) from the llama.cpp that llama-cpp-python VERSION vendors (its sdist's
# vendor/llama.cpp), once, into DIR/llama.cpp-tools-VERSION-KEY; KEY hashes the tools, the variants
# and the flags, so another list or other flags build anew. Prints the tools' directory on its last line.
#
#   scripts/build_llama_tools.sh VERSION DIR [PYTHON]
#   scripts/build_llama_tools.sh --built VERSION DIR   # exit 0 when that build is there (nothing is built)
#
# CPU code is picked at run time (ggml's backend loading: GGML_BACKEND_DL, one libggml-cpu-*.so per
# x86 variant, the best the CPU supports is loaded), never -march=native: the same build runs fast on
# every x86-64 CPU. GGML_CPU_ALL_VARIANTS builds 14 x86 variants, each a full compile of ggml's CPU
# backend; KEEP_VARIANTS cuts the list, in the build's own copy of the sources, to those that cover
# today's CPUs (ggml's CMake has no option for a subset), so the build fits a 2-core CI machine.
set -euo pipefail
check_only=0
if [ "${1:-}" = --built ]; then check_only=1; shift; fi
VERSION=${1:?usage: build_llama_tools.sh VERSION DIR [PYTHON]}
DIR=${2:?usage: build_llama_tools.sh VERSION DIR [PYTHON]}
PY=${3:-python3}
TOOLS=(llama-server llama-bench llama-quantize llama-imatrix llama-perplexity)
# x64: any x86-64 (the fallback); sandybridge: AVX; haswell: AVX2+FMA (most CPUs since 2013);
# skylakex: AVX-512; icelake: AVX-512 VBMI/VNNI; zen4: AVX-512 BF16 (AMD EPYC 9004, Ryzen 7000);
# alderlake: AVX-VNNI (Intel client CPUs without AVX-512); sapphirerapids: AMX (Xeon 4th gen on).
KEEP_VARIANTS="x64 sandybridge haswell skylakex icelake zen4 alderlake sapphirerapids"
CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN")

key=$(printf '%s\n' "${TOOLS[*]}" "$KEEP_VARIANTS" "${CMAKE_FLAGS[*]}" | sha256sum | cut -c1-12)
dest="$DIR/llama.cpp-tools-$VERSION-$key"
if [ -f "$dest/BUILD.json" ]; then
  [ "$check_only" = 1 ] || echo "$dest"
  exit 0
fi
[ "$check_only" = 0 ] || exit 1
mkdir -p "$DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# cmake >= 3.14 and ninja: the system's, else from PyPI into the Python environment that runs this.
bindir=$(dirname "$PY")
need=()
cmake_ok() { "$1" --version 2>/dev/null | awk 'NR==1{split($3,v,"."); exit !(v[1]>3 || (v[1]==3 && v[2]>=14))}'; }
CMAKE=$(command -v cmake || true)
{ [ -n "$CMAKE" ] && cmake_ok "$CMAKE"; } || { need+=(cmake); CMAKE="$bindir/cmake"; }
NINJA=$(command -v ninja || true)
[ -n "$NINJA" ] || { need+=(ninja); NINJA="$bindir/ninja"; }
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing ${need[*]} from PyPI into $(dirname "$bindir")" >&2
  "$PY" -m pip install -q "${need[@]}" >&2
fi

# The compile's CPU seconds, measured (BUILD.json's cpu_seconds of this list and these flags on a 2-core
# Xeon): the wait on N idle cores is about that over N; other work on the machine lengthens it.
CPU_SECONDS=1300
minutes=$(( (CPU_SECONDS / $(nproc) + 59) / 60 ))
echo "==> building llama.cpp's tools from llama-cpp-python $VERSION's sources: about $minutes min on $(nproc) idle cores (once; kept in $dest)" >&2
start=$(date +%s)
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work" "llama_cpp_python-$VERSION/vendor/llama.cpp"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
# Keep only KEEP_VARIANTS' x86 lines (a variant line of another architecture stays: not built here).
keep_re=$(echo "$KEEP_VARIANTS" | tr ' ' '|')
sed -i -E "/ggml_add_cpu_backend_variant\((sse42|sandybridge|ivybridge|piledriver|haswell|skylakex|cannonlake|cascadelake|icelake|cooperlake|zen4|alderlake|sapphirerapids|x64)( |\))/{/\((${keep_re})( |\))/!d}" \
  "$src/ggml/src/CMakeLists.txt"
built_variants=$(grep -oE "ggml_add_cpu_backend_variant\((x64|sse42|sandybridge|ivybridge|piledriver|haswell|skylakex|cannonlake|cascadelake|icelake|cooperlake|zen4|alderlake|sapphirerapids)( |\))" \
  "$src/ggml/src/CMakeLists.txt" | sed -E 's/.*\(([a-z0-9]+).*/\1/' | tr '\n' ' ')
log="$work/build.log"
if ! { "$CMAKE" -S "$src" -B "$work/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" "${CMAKE_FLAGS[@]}" \
       && "$CMAKE" --build "$work/build" --parallel "$(nproc)" --target "${TOOLS[@]}"; } >"$log" 2>&1; then
  cp "$log" "$DIR/llama.cpp-tools-build.log"
  echo "llama.cpp's tools failed to build (log: $DIR/llama.cpp-tools-build.log)" >&2
  exit 1
fi
stage="$dest.partial.$$"
rm -rf "$stage"
mkdir -p "$stage"
for t in "${TOOLS[@]}"; do cp "$work/build/bin/$t" "$stage/"; done
cp -P "$work/build/bin/"lib*.so* "$stage/"
seconds=$(( $(date +%s) - start ))
# CPU seconds of the compilers (bash's `times`, children's line): the build's cost on a machine of its own.
# `times` runs in this shell (a $(...) around it would report that subshell's children: none)
times >"$work/times"
cpu=$(tail -1 "$work/times" | awk '{split($1, u, "m"); split($2, s, "m"); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2]}')
commit=$(sed -n 's/^-- ggml commit: *//p' "$log" | head -1)  # what ggml's CMake read from the sources
printf '{"llama_cpp_python": "%s", "llama_cpp_commit": "%s", "tools": "%s", "cpu_variants": "%s", "cmake_flags": "%s", "build_seconds": %d, "cpu_seconds": %d, "cores": %d, "built": "%s"}\n' \
  "$VERSION" "${commit:-unknown}" "${TOOLS[*]}" "${built_variants% }" "${CMAKE_FLAGS[*]}" "$seconds" "$cpu" "$(nproc)" "$(date -u +%FT%TZ)" > "$stage/BUILD.json"
rm -rf "$dest"
mv "$stage" "$dest"
echo "==> llama.cpp's tools built in ${seconds} s, ${cpu} CPU seconds (CPU variants: ${built_variants% })" >&2
echo "$dest"
