"""What the subcommands share: the error exit, the server options as a ServerConfig,
writing or printing a text, number formatting and the per-level table of ``run`` and
``runs show``."""
from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from app.config import ConfigError, ServerConfig, config_from_namespace
from app.fileio import write_atomic


def err(msg: str) -> int:
    """Print ``vllm-dyno: MSG`` to stderr; returns exit status 2 (bad input)."""
    print(f"vllm-dyno: {msg}", file=sys.stderr)
    return 2


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
    validation message on error."""
    try:
        return config_from_namespace(a, base)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors())
        raise SystemExit(f"error: invalid server options: {msgs}")
    except ConfigError as e:
        raise SystemExit(f"error: {e}")
