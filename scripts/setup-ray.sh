#!/usr/bin/env bash
# Idempotently create .venv-ray with Ray (ray==2.60.0) for the multinode test of the Ray
# backend's cluster start (tests/multinode/test_multinode.py): the CPU build of vLLM refuses the Ray
# executor, so the real Ray cluster there is started by the agents with this interpreter
# and the served part is the sim. A separate venv: .venv and .venv-vllm stay as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION="${VLLM_DYNO_RAY_VERSION:-2.60.0}"
. scripts/venv-cache.sh
cached_venv .venv-ray "venv-ray-$RAY_VERSION"
VENV="$VENV_TARGET"
STAMP="$VENV/.dyno-ray-ok"
exec 9>"$VENV.lock" && flock 9  # one build at a time per cache
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RAY_VERSION" ] && "$VENV/bin/python" -c "import ray" 2>/dev/null; then
  exit 0
fi
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "ray==$RAY_VERSION"
"$VENV/bin/python" -c "import ray; print('ray', ray.__version__)"
echo "$RAY_VERSION" > "$STAMP"
