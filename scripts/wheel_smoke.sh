#!/usr/bin/env bash
# The product as a user installs it: build quantkit's wheel, install it (not editable) into a fresh
# venv, and run the smoke test from outside the checkout, so nothing can come from the source tree:
# the built-in recipes, sets and tasks must come from the wheel. The fresh venv borrows .venv's
# third-party packages (a path entry, which does not carry .venv's editable install of quantkit)
# instead of downloading them again; `pip check` then checks the wheel's declared requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=$(mktemp -d -t qk-wheel-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "==> building the wheel"
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation . -w "$WORK/dist" 2>&1 | grep -v "^WARNING: Location" || true
WHEEL=$(ls "$WORK"/dist/quantkit-*.whl)
.venv/bin/python - "$WHEEL" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["quantkit/_data/recipes/int4-w4a16-rtn.yaml", "quantkit/_data/studies/levers-llamacpp.yaml",
        "quantkit/_data/calib_data/mix/default.yaml", "quantkit/_data/calib_data/text/world-factbook.txt",
        "quantkit/_data/evals/data/qk_facts.jsonl"]
missing = [n for n in need if n not in names]
sys.exit(f"the wheel lacks {missing}" if missing else 0)
PY

echo "==> installing it into a fresh venv"
"${PYTHON:-python3}" -m venv "$WORK/venv"
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$WORK/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" | xargs -I{} sh -c "echo '$SITE' > {}/qk-borrowed.pth"
"$WORK/venv/bin/python" -m pip install -q --no-deps "$WHEEL" 2>&1 | grep -v "^WARNING: Location" || true
"$WORK/venv/bin/python" -m pip check >/dev/null 2>&1 || "$WORK/venv/bin/python" -m pip check | grep -i quantkit && exit 1 || true

echo "==> smoke test from outside the checkout"
cd "$WORK"
Q="$WORK/venv/bin/quantkit"
where=$("$WORK/venv/bin/python" -c "import quantkit, os; print(os.path.dirname(quantkit.__file__))")
case "$where" in "$REPO"*) echo "quantkit was imported from the checkout ($where), not the wheel" >&2; exit 1;; esac
"$Q" recipe list > "$WORK/recipes.txt" && grep -q "^int4-w4a16-gptq-g64 " "$WORK/recipes.txt"
"$Q" models pull demo >/dev/null
"$Q" convert int4-w4a16-rtn --model demo --out "$WORK/int4" --json >/dev/null
"$Q" eval "$WORK/int4" --baseline demo --text set:legal-licenses --max-tokens 1024 --seq-len 256 --json > "$WORK/eval.json"
"$WORK/venv/bin/python" - "$WORK/eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["kld"]["mean"] > 0 and r["windows"]["count"] == 4, r
print(f"wheel smoke test: ok (INT4 RTN on set:legal-licenses: dPPL {r['delta_ppl_pct']:+.1f}%, KL {r['kld']['mean']:.3f})")
PY
