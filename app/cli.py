"""``vllm-dyno``: with no subcommand it opens the GUI; headless subcommands otherwise.

The one composition root: it imports ``widgets`` lazily, only for the GUI.
Each subcommand lives in the module that owns it and registers itself here.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from app import __version__

#: modules with a ``register(subparsers)`` function, in help order
COMMAND_MODULES = [
    "app.server.cli_serve",
    "app.planner.cli_plan",
    "app.planner.cli_calibrate",
    "app.loadgen.cli_ramp",
    "app.telemetry.cli_telemetry",
    "app.cli_profiles",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-dyno", description="A dynamometer for local vLLM inference servers.")
    p.add_argument("--version", action="version", version=f"vllm-dyno {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command")
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_helper"]:  # frozen build re-entering itself (app.helper_process)
        mod = importlib.import_module(argv[1])
        return int(mod.main(argv[2:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        try:
            gui = importlib.import_module("widgets.main")
        except ImportError as e:
            print(f"the GUI is not available ({e}); use a subcommand, see --help", file=sys.stderr)
            return 2
        return int(gui.main() or 0)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
