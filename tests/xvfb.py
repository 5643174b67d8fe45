"""A real X server for the tests that open the window on Qt's xcb platform: Xvfb on a
free display (``-displayfd``: the server picks the number and says it)."""
from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from typing import Iterator

import pytest


@contextmanager
def xvfb(width: int = 1280, height: int = 800, depth: int = 24) -> Iterator[str]:
    """Yield the ``DISPLAY`` of a fresh Xvfb screen of ``width``×``height``; stopped after.
    Skips where Xvfb is not installed, except on CI (``make system`` installs it there)."""
    exe = shutil.which("Xvfb")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Xvfb is not installed: `make system` (scripts/setup-system.sh) installs it")
        pytest.skip("Xvfb is not installed (make system)")
    r, w = os.pipe()
    proc = subprocess.Popen([exe, "-displayfd", str(w), "-screen", "0", f"{width}x{height}x{depth}", "-nolisten",
                             "tcp", "-noreset"], pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(w)
    try:
        with os.fdopen(r) as f:
            num = f.readline().strip()
        if not num:
            raise RuntimeError(f"Xvfb did not start: {proc.stderr.read().decode(errors='replace')[-500:]}")
        yield f":{num}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
