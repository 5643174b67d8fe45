"""The app starts without warnings that say nothing about it (issue 37: five
CryptographyDeprecationWarnings from asyncssh's import at every start). A fresh interpreter,
as the window and every command start: a module imported once warns once."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_window_and_the_hosts_link_prints_no_cryptography_warning():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-W", "default", "-c", "import app.hosts.link, widgets.main_window"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CryptographyDeprecationWarning" not in out.stderr, out.stderr[-2000:]
