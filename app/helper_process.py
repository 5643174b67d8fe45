"""How the app starts its own helper processes (reaper, load generator, sim server).

From a normal install a helper is ``sys.executable -m MODULE``. In a frozen build
(PyInstaller: ``sys.frozen``) there is no separate Python: the executable re-enters
itself as ``EXE _helper MODULE ...`` and ``app.cli`` dispatches to the module's
``main(argv)``.
"""
from __future__ import annotations

import sys


def helper_argv(module: str) -> list[str]:
    """Argv prefix that runs ``module``'s ``main()`` in a fresh process."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "_helper", module]
    return [sys.executable, "-m", module]
