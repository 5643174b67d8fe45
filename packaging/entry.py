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
    environment for subprocesses"). The app's own helpers are this executable started
    again, whose bootloader sets the variable afresh; this process itself no longer needs
    it (the dynamic loader read it at exec time)."""
    if not getattr(sys, "frozen", False):
        return
    orig = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if orig is not None:
        os.environ["LD_LIBRARY_PATH"] = orig
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)


if __name__ == "__main__":
    restore_library_path()
    from app.cli import main

    sys.exit(main())
