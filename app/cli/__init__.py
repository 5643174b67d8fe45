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
import shlex
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


def _extra_joined(argv: list[str]) -> list[str]:
    """``--extra --no-enable-chunked-prefill`` → ``--extra=--no-enable-chunked-prefill``: argparse
    takes a value that starts with "-" and has no space for an option of its own and refuses
    it; ``--extra`` takes one vLLM flag this way, several as loose tokens after it
    (:func:`_extra_loose`: ``--extra --max-loras 4 --max-lora-rank 64``), or many in one
    string (``--extra "--max-loras 4 --max-lora-rank 64"``)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--extra" and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append("--extra=" + argv[i + 1])
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _extra_loose(argv: list[str], unknown: list[str]) -> tuple[list[str], list[str]]:
    """(the tokens of ``unknown`` that follow an ``--extra`` value in ``argv`` without a
    vllm-dyno option between them, the rest): ``--extra --max-loras 4 --max-lora-rank 64``
    gives ``--max-loras`` to ``--extra`` (:func:`_extra_joined`) and leaves ``4
    --max-lora-rank 64`` to argparse, which knows none of them — they are ``--extra``'s too.
    A token argparse did not take that does not follow such a run (``plan --swap-space 4``)
    stays unknown. ``argv`` as :func:`_extra_joined` wrote it."""
    pos, j = [], 0
    for u in unknown:  # where each unknown token stands (argparse keeps their order)
        while j < len(argv) and argv[j] != u:
            j += 1
        pos.append(j)
        j += 1
    starts = {i + 1 for i, a in enumerate(argv) if a.startswith("--extra=")}
    starts |= {i + 2 for i, a in enumerate(argv) if a == "--extra"}
    loose, rest, run = [], [], -1
    for u, at in zip(unknown, pos):
        if at in starts or at == run:
            loose.append(u)
            run = at + 1
        else:
            rest.append(u)
    return loose, rest


def _unknown_message(args: argparse.Namespace, unknown: list[str]) -> str:
    """argparse's "unrecognized arguments" and, for a command that passes options on to
    vLLM, the hint to give the ones it does not know with ``--extra``."""
    said = f"unrecognized arguments: {' '.join(unknown)}"
    if not hasattr(args, "extra") or not unknown[0].startswith("--"):
        return said
    flags = [u for u in unknown if u.startswith("--")]
    return (f"{said}. vllm-dyno {args.command} has no option {', '.join(flags)} of its own; pass vLLM options it "
            f"does not know with --extra, e.g. --extra \"{' '.join(unknown)}\" (several in one string), or "
            f"--extra {unknown[0]} for one flag")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_helper"]:  # frozen build re-entering itself (app.helper_process)
        mod = importlib.import_module(argv[1])
        return int(mod.main(argv[2:]) or 0)
    parser = build_parser()
    joined = _extra_joined(argv)
    args, unknown = parser.parse_known_args(joined)
    if unknown and hasattr(args, "extra"):
        loose, unknown = _extra_loose(joined, unknown)
        if loose:
            args.extra = " ".join(x for x in (args.extra, shlex.join(loose)) if x)
    if unknown:
        parser.error(_unknown_message(args, unknown))
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
