#!/usr/bin/env bash
# Idempotently install the Debian packages the app needs (`make run`), and with --test those
# the tests need besides (`make test-fast`, `make test`).
#
# The app: Qt's offscreen/xcb platform plugins load libEGL/libGL, fontconfig, xkbcommon and
# dbus; the xcb platform (a real window on X11) also needs the xcb utility libraries — Qt >= 6.5
# refuses to start without libxcb-cursor0 (widgets/platform_check.py names what is missing
# when the window cannot open).
# The tests: Xvfb (the window on the xcb platform, tests/integration/test_gui_xcb.py),
# Chromium (the HTML report rendered headless, tests/integration/test_report_html.py) and
# iproute2 (`ip netns`: the multi-host test bed, tests/netns.py); xdotool (real X input events:
# scripts/new_user_run.py, not in CI).
set -euo pipefail
pkgs=(libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3 libglib2.0-0 fonts-dejavu-core
      libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 libxcb-shape0
      libxcb-xinerama0 libxcb-xkb1 libxcb-randr0 libxcb-xfixes0 libxcb-sync1 libxcb-shm0 libx11-xcb1
      libxkbcommon-x11-0)
if [ "${1:-}" = "--test" ]; then
  pkgs+=(xvfb chromium iproute2 xdotool)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
