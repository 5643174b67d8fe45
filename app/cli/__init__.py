"""``vllm-dyno``: with no subcommand it opens the GUI; headless subcommands otherwise.

The one composition root: it imports ``widgets`` lazily, only for the GUI. Each
command family is one module of this package (``serve``, ``plan``, ``predict``, ``calibrate``,
``ramp``, ``telemetry``, ``runs``, ``compare``, ``profiles``, ``tune``, ``agent``) with a
``register(subparsers)`` function; the package is the top layer of ``app`` (see the
import-linter contracts in pyproject.toml) and its modules do not import each other
(``common`` aside).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from app import __version__

#: modules with a ``register(subparsers)`` function, in help order
COMMAND_MODULES = [
    "app.cli.serve",
    "app.cli.plan",
    "app.cli.predict",
    "app.cli.calibrate",
    "app.cli.ramp",
    "app.cli.telemetry",
    "app.cli.runs",
    "app.cli.compare",
    "app.cli.profiles",
    "app.cli.tune",
    "app.cli.agent",
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
