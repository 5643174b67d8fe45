"""PyInstaller entry point: the frozen executable runs app.cli.main (GUI with no
subcommand; headless subcommands; ``_helper MODULE`` for the app's own helper processes)."""
import os
import sys


def restore_library_path() -> None:
    """Give programs the app starts the user's ``LD_LIBRARY_PATH`` back.

    PyInstaller's bootloader points ``LD_LIBRARY_PATH`` at the bundle's ``_internal``
    folder (keeping the user's value in ``LD_LIBRARY_PATH_ORIG``), so every child process
    would load the bundle's libstdc++, libssl, libz … instead of its own — wrong for vLLM,
    which runs on the user's Python and CUDA stack (PyInstaller manual, "Ensuring proper
    environment for subprocesses"). The app's own helpers (this executable started again)
    find the bundle's libraries without it, and this process no longer needs it (the
    dynamic loader read it at exec time). widgets/smoke.py checks the helpers' environment."""
    if not getattr(sys, "frozen", False):
        return
    bundle = os.path.realpath(getattr(sys, "_MEIPASS", os.path.dirname(sys.executable)))
    orig = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    # a re-entered helper inherits the restored value and its bootloader leaves it alone
    # (no _ORIG then): keep every entry that is not the bundle
    value = orig if orig is not None else os.environ.get("LD_LIBRARY_PATH", "")
    kept = [p for p in value.split(os.pathsep) if p and os.path.realpath(p) != bundle]
    if kept:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(kept)
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)


if __name__ == "__main__":
    restore_library_path()
    from app.cli import main

    sys.exit(main())
