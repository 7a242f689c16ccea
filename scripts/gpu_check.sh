#!/usr/bin/env bash
# The one-command GPU check (benchmarks/gpu_check.py; docs/results/gpu.md says how to read and use it).
#   bash scripts/gpu_check.sh prepare             # here, with network: .gpu-bundle/ (wheels + tokenizer, <= 64 MiB)
#   bash scripts/gpu_check.sh run "$OUT"          # on the GPU machine: at most 9 minutes; $OUT/summary.{md,json}
#   bash scripts/gpu_check.sh run /tmp/x --dry-run   # anywhere: the bundle's imports and the plan, no GPU needed
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=$(command -v python || command -v python3); fi
case "${1:-}" in
  prepare) shift; exec "$PY" benchmarks/gpu_check.py prepare "$@" ;;
  run) out=${2:?usage: bash scripts/gpu_check.sh run OUT_DIR [--budget S] [--only ITEM ...] [--dry-run]}
       shift 2; exec "$PY" benchmarks/gpu_check.py run --out "$out" "$@" ;;
  *) echo "usage: bash scripts/gpu_check.sh prepare [--python 3.X ...] | run OUT_DIR [--budget S] [--only ITEM ...] [--dry-run]" >&2
     exit 2 ;;
esac
