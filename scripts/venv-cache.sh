# Sourced by setup-vllm.sh and setup-ray.sh: put a big venv in the user's cache, keyed by
# what it holds, and link it from the checkout, so that every clone on this machine (a CI
# run clones afresh each time) shares one install instead of building 3.4 GB again.
#   cached_venv LINK KEY  → sets VENV_TARGET; LINK (e.g. .venv-vllm) becomes a symlink to it
# VLLM_DYNO_VENV_CACHE=0 keeps the venv inside the checkout (a plain folder, as before).
cached_venv() {
  local link="$1" key="$2"
  if [ "${VLLM_DYNO_VENV_CACHE:-1}" = "0" ]; then VENV_TARGET="$link"; return; fi
  local cache="${VLLM_DYNO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-dyno}"
  mkdir -p "$cache"
  VENV_TARGET="$cache/$key"
  if [ -L "$link" ] && [ "$(readlink "$link")" = "$VENV_TARGET" ]; then return; fi
  if [ -d "$link" ] && [ ! -L "$link" ]; then VENV_TARGET="$link"; return; fi  # a venv built in the checkout: kept
  rm -f "$link"
  ln -s "$VENV_TARGET" "$link"
}
