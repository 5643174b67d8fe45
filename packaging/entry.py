"""PyInstaller entry point: the frozen executable runs app.cli.main (GUI with no
subcommand; headless subcommands; ``_helper MODULE`` for the app's own helper processes)."""
import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
