"""What the subcommands share: the error exit, the server options as a ServerConfig,
the API key file and the ``--expose`` confirmation, writing or printing a text, number
formatting and the per-level table of ``run`` and ``runs show``."""
from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from app.config import ConfigError, ServerConfig, config_from_namespace, exposure_lines, read_secret_file
from app.fileio import write_atomic


def err(msg: str) -> int:
    """Print ``vllm-dyno: MSG`` to stderr; returns exit status 2 (bad input)."""
    print(f"vllm-dyno: {msg}", file=sys.stderr)
    return 2


class BadInput(SystemExit):
    """Exit status 2 (bad input), the message printed to stderr as ``vllm-dyno: error:
    MSG`` when raised; ``str()`` is the message (no traceback reaches the user)."""

    def __init__(self, msg: str) -> None:
        print(f"vllm-dyno: error: {msg}", file=sys.stderr)
        super().__init__(2)
        self.msg = msg

    def __str__(self) -> str:
        return self.msg


def add_security_options(parser: argparse.ArgumentParser, *, expose: bool = True) -> None:
    """``--api-key-file`` (and, for commands that launch a server, ``--expose``)."""
    parser.add_argument("--api-key-file", metavar="PATH",
                        help="read the API key from this file (first line; keep it chmod 600) instead of the "
                             "environment's VLLM_API_KEY; it reaches the server through its environment only, "
                             "never a command line")
    if expose:
        parser.add_argument("--expose", action="store_true",
                            help="allow a --host beyond loopback (e.g. 0.0.0.0: every interface, reachable from "
                                 "other machines); without it such a host is refused")


def apply_api_key_file(a: argparse.Namespace) -> None:
    """With ``--api-key-file PATH``: read the key (warn when the file is readable by
    others) and put it in this process's environment as ``VLLM_API_KEY``, whence the
    server (and the load generator) inherit it; never on a command line. Raises
    :class:`BadInput` naming the file when it cannot be used."""
    path = getattr(a, "api_key_file", None)
    if not path:
        return
    try:
        key, warnings = read_secret_file(path)
    except ConfigError as e:
        raise BadInput(str(e)) from None
    for w in warnings:
        print(f"vllm-dyno: warning: {w}", file=sys.stderr)
    os.environ["VLLM_API_KEY"] = key


def print_exposure(cfg: ServerConfig, port: int | None = None) -> None:
    """Print what a server on ``cfg.host`` exposes (nothing for loopback): the real
    bound address(es) and a warning when no API key is set (app.config.exposure_lines)."""
    env = {**os.environ, **cfg.env}
    for line in exposure_lines(cfg.host, port if port is not None else cfg.port, env):
        print(f"  {line}", flush=True)


def write_or_print(text: str, out: str | None) -> None:
    """Write ``text`` to the file ``out`` (atomically) or to stdout."""
    if out:
        write_atomic(out, text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def fmt(v, nd: int = 1, scale: float = 1.0) -> str:
    """``v × scale`` with ``nd`` decimals; an em dash for None."""
    return "—" if v is None else f"{v * scale:.{nd}f}"


def level_table(levels: list[dict]) -> str:
    """The per-level table printed by ``run`` and ``runs show`` (ms for latencies)."""
    head = f"{'level':>6} {'out tok/s':>10} {'req/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p99':>9} " \
           f"{'ITL p99':>8} {'fail':>6}  SLO"
    lines = [head, "-" * len(head)]
    for d in levels:
        slo = "broken: " + "; ".join(d.get("slo_broken") or []) if d.get("slo_broken") else "ok"
        lines.append(f"{d['level']:>6g} {fmt(d.get('output_tps')):>10} {fmt(d.get('rps'), 2):>7} "
                     f"{fmt(d.get('ttft_p50'), 0, 1e3):>7}ms {fmt(d.get('ttft_p99'), 0, 1e3):>7}ms "
                     f"{fmt(d.get('tpot_p99'), 1, 1e3):>7}ms {fmt(d.get('itl_p99'), 1, 1e3):>6}ms "
                     f"{(d.get('failure_rate') or 0) * 100:>5.1f}%  {slo}")
    return "\n".join(lines)


def config_from_args(a: argparse.Namespace, base: ServerConfig | None = None) -> ServerConfig:
    """Build a ServerConfig from options added by :func:`app.config.add_server_options`
    (over ``base``, see :func:`app.config.config_from_namespace`); exits with the
    validation message (status 2, :class:`BadInput`) on error."""
    try:
        return config_from_namespace(a, base)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors())
        raise BadInput(f"invalid server options: {msgs}") from None
    except ConfigError as e:
        raise BadInput(str(e)) from None


def positive_seconds(text: str) -> float:
    """argparse type: a duration in seconds > 0 (``--startup-timeout``, ``--grace``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, e.g. 60") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds greater than 0, e.g. 60")
    return v
