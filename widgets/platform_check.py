"""Before the window: can Qt's platform plugin open it here? (issue 19, item 1)

Without the libraries Qt's xcb platform plugin needs, the window never opens and Qt
prints only "Could not load the Qt platform plugin "xcb" … no Qt platform plugin could
be initialized" and aborts (SIGABRT, a core dump). :func:`check_platform` finds out
first and says which Debian/Ubuntu packages to install:

- the plugin's link-time libraries: ``ldd`` of ``libqxcb.so`` (which resolves
  ``libQt6XcbQpa.so.6`` and the rest recursively), every ``=> not found`` line;
- the libraries Qt loads with ``dlopen`` at start, which ``ldd`` cannot see:
  ``libxcb-cursor.so.0`` (Qt ≥ 6.5 refuses to start the xcb platform without it: qtbase
  src/plugins/platforms/xcb/qxcbcursor.cpp), tried with the dynamic loader itself.

No display at all (neither ``DISPLAY`` nor ``WAYLAND_DISPLAY``) is said plainly too, with
the ways on (a display, ``QT_QPA_PLATFORM=offscreen``, or the command line). Nothing here
imports Qt: the plugin is found from PySide6's package folder (or a frozen build's).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

#: soname → the Debian/Ubuntu package that ships it (bookworm, jammy and later)
DEBIAN_PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xinput.so.0": "libxcb-xinput0",
    "libxcb-glx.so.0": "libxcb-glx0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
}
#: what the xcb platform loads with dlopen (not in ldd's answer)
DLOPENED = ("libxcb-cursor.so.0",)


class PlatformProblem(RuntimeError):
    """The window cannot open here; the message says why and what to do."""


def xcb_plugin() -> Path | None:
    """``libqxcb.so`` of the PySide6 this process would use (a checkout's venv, an
    installed wheel, or a frozen build's bundle), or None when there is none."""
    roots: list[Path] = []
    if getattr(sys, "frozen", False):
        roots.append(Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)))
    spec = importlib.util.find_spec("PySide6")
    if spec is not None and spec.submodule_search_locations:
        roots.extend(Path(p) for p in spec.submodule_search_locations)
    for root in roots:
        for cand in (root / "Qt" / "plugins" / "platforms" / "libqxcb.so",
                     root / "PySide6" / "Qt" / "plugins" / "platforms" / "libqxcb.so"):
            if cand.is_file():
                return cand
    return None


def ldd_missing(binary: Path) -> list[str]:
    """The sonames ``ldd`` cannot find for ``binary`` (its whole dependency tree), in
    order, each once; [] when ldd is not installed or cannot read it."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        out = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    missing: list[str] = []
    for line in out.splitlines():
        name, sep, rest = line.strip().partition("=>")
        if sep and rest.strip() == "not found" and name.strip() not in missing:
            missing.append(name.strip())
    return missing


def unloadable(sonames: Iterable[str]) -> list[str]:
    """The sonames the dynamic loader cannot load into this process (as Qt's dlopen)."""
    out = []
    for name in sonames:
        try:
            ctypes.CDLL(name)
        except OSError:
            out.append(name)
    return out


def missing_message(sonames: Sequence[str], platform: str = "xcb") -> str:
    """What the user reads: the missing libraries, their packages, the command."""
    pkgs = []
    for s in sonames:
        p = DEBIAN_PACKAGES.get(s)
        if p and p not in pkgs:
            pkgs.append(p)
    unknown = [s for s in sonames if s not in DEBIAN_PACKAGES]
    lines = [f"vllm-dyno: the window cannot open: Qt's {platform} platform needs libraries this system lacks: "
             + ", ".join(sonames) + "."]
    if pkgs:
        lines.append("Install them (Debian/Ubuntu): sudo apt-get install " + " ".join(pkgs))
    if unknown:
        lines.append("Find the package of " + ", ".join(unknown) + " with your distribution's search "
                     "(apt-file search NAME, dnf provides '*/NAME').")
    lines.append("`make system` installs them on Debian/Ubuntu. Every command of vllm-dyno works without the "
                 "window (vllm-dyno --help); QT_QPA_PLATFORM=offscreen runs the window without a screen.")
    return "\n".join(lines)


def check_platform(env: dict[str, str] | None = None, plugin: Path | None = None,
                   dlopened: Sequence[str] = DLOPENED) -> None:
    """Raise :class:`PlatformProblem` when Qt cannot open the window with ``env``'s
    platform (``QT_QPA_PLATFORM``; unset: xcb on X11, Wayland when only
    ``WAYLAND_DISPLAY`` is set). Only xcb and "no display" are checked: offscreen, vnc,
    Wayland and the rest are left to Qt. ``plugin``: the xcb plugin to inspect (default
    :func:`xcb_plugin`)."""
    env = dict(os.environ if env is None else env)
    asked = env.get("QT_QPA_PLATFORM", "").split(":", 1)[0].strip().lower()
    if asked and asked != "xcb":
        return
    if not asked:
        if env.get("WAYLAND_DISPLAY") and not env.get("DISPLAY"):
            return
        if not env.get("DISPLAY"):
            raise PlatformProblem(
                "vllm-dyno: the window cannot open: there is no display (neither DISPLAY nor WAYLAND_DISPLAY is "
                "set). Start it from a desktop session or over `ssh -X`, or run the window without a screen with "
                "QT_QPA_PLATFORM=offscreen; every command works without one (vllm-dyno --help).")
    plugin = plugin or xcb_plugin()
    if plugin is None:
        return  # no xcb plugin to inspect: Qt says what it finds
    missing = ldd_missing(plugin) + [s for s in unloadable(dlopened)]
    seen: list[str] = []
    for s in missing:
        if s not in seen:
            seen.append(s)
    if seen:
        raise PlatformProblem(missing_message(seen))
