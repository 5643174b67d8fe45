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


#: beside a p99 judged on fewer than app.loadgen.capacity.P99_MIN_REQUESTS requests
FEW_MARK = "†"
#: beside a level cut short (app.loadgen.stats.is_partial: stopped, or the ramp's cap)
PARTIAL_MARK = "~"
#: what the table's columns count (printed under it)
TABLE_LEGEND = ("TTFT, TPOT, ITL in ms, e2e in s; reqs: requests sent in the measuring window (the latencies\n"
                "are theirs), fail: of those; out tok/s: output tokens that arrived in the window; req/s:\n"
                "requests that ended in it.")


def level_table(levels: list[dict], *, slo: bool = True) -> str:
    """The one per-level table (``ramp``, ``run``, ``runs show``): ``levels`` are StepStats
    dicts (StepStats.model_dump() or RunStore.levels rows); latencies in ms, e2e in s. A
    p99 from fewer than P99_MIN_REQUESTS requests carries :data:`FEW_MARK`, a level that
    measured a start-up transient ``*`` (both explained under the table). ``slo``: show
    the SLO column (False when the run had no SLO: "ok" would mean nothing)."""
    # deferred: app.cli.common is imported by every command; the capacity module only by those that print levels
    from app.loadgen.capacity import P99_MIN_REQUESTS
    from app.loadgen.stats import is_partial

    head = (f"{'level':>7} {'reqs':>5} {'fail':>5} {'out tok/s':>9} {'req/s':>6} {'TTFT p50':>8} {'TTFT p99':>8} "
            f"{'TPOT p50':>8} {'TPOT p99':>8} {'ITL p50':>7} {'e2e p99':>8}" + ("  SLO" if slo else ""))
    lines = [head]
    few_any = unsteady = partial = False
    for d in levels:
        n_ok = d.get("n_ok")
        few = FEW_MARK if n_ok is not None and n_ok < P99_MIN_REQUESTS else ""
        few_any = few_any or bool(few)
        mark = "*" if d.get("steady") is False else ""
        unsteady = unsteady or bool(mark)
        if is_partial(d):
            mark += PARTIAL_MARK
            partial = True
        level = f"{d['level']:g}" + ("/s" if d.get("mode") == "rate" else "") + mark
        p99 = (lambda v, nd=0: "—" if v is None else fmt(v, nd, 1e3) + few)
        e2e = "—" if d.get("e2e_p99") is None else fmt(d["e2e_p99"], 2) + few
        row = (f"{level:>7} {d.get('n_measured', '—'):>5} {(d.get('failure_rate') or 0) * 100:>4.0f}% "
               f"{fmt(d.get('output_tps')):>9} {fmt(d.get('rps'), 2):>6} {fmt(d.get('ttft_p50'), 0, 1e3):>8} "
               f"{p99(d.get('ttft_p99')):>8} {fmt(d.get('tpot_p50'), 1, 1e3):>8} {p99(d.get('tpot_p99'), 1):>8} "
               f"{fmt(d.get('itl_p50'), 1, 1e3):>7} {e2e:>8}")
        if slo:
            row += "  " + ("broken: " + "; ".join(d["slo_broken"]) if d.get("slo_broken") else "met")
        lines.append(row)
    lines.append(TABLE_LEGEND)
    if few_any:
        lines.append(f"{FEW_MARK} p99 from fewer than {P99_MIN_REQUESTS} requests (one or none above it)")
    if unsteady:
        lines.append("* the level's window was shorter than its median request: a start-up transient")
    if partial:
        lines.append(f"{PARTIAL_MARK} a partial level: cut short (stopped, or the ramp's time cap); its figures are "
                     "from the part that ran")
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


def perturb_seed(text: str) -> int:
    """argparse type: ``--sim-perturb``'s seed, a whole number ≥ 0 (0: no perturbation)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed: give a whole number such as 7 (0: none)") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text}: give a seed ≥ 1 (0: no perturbation)")
    return v


def positive_seconds(text: str) -> float:
    """argparse type: a duration in seconds > 0 (``--startup-timeout``, ``--grace``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, e.g. 60") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds greater than 0, e.g. 60")
    return v


def profile_for_launch(a: argparse.Namespace):
    """The profile ``a.profile`` (a library name or a YAML file) for a command that
    launches it (``run``, ``tune``): the vLLM options given on the command line override
    its own, ``--api-key-file`` is applied, a host beyond loopback needs ``--expose`` and
    its ``env:`` is screened (a shared file: loader and interpreter variables need
    ``--trust-env``; app.profiles.env_policy) — the profile returned holds only what may
    reach the server. Returns ``(profile, config, trusted, builtin)``
    — ``trusted`` the pairs the user confirmed, ``builtin`` whether it ships with the app.
    Raises :class:`BadInput` naming the profile and the fix."""
    # deferred: only the launching commands need the profile library
    from app.config import exposure_problem
    from app.profiles import ProfileLibrary, ProfileNotFound, read_profile
    from app.profiles.env_policy import CLI_FIX, EnvRefused, screen_env
    from app.profiles.io import ProfileError

    builtin = False
    try:
        if a.profile.endswith((".yaml", ".yml")) and os.path.isfile(a.profile):
            p = read_profile(a.profile)
        else:
            entry = ProfileLibrary().entry(a.profile)
            p, builtin = entry.profile, entry.read_only
    except (ProfileError, ProfileNotFound) as e:
        raise BadInput(str(e)) from None
    cfg = config_from_args(a, base=p.server_config(resolve=False))
    exposed = exposure_problem(cfg.host)
    if exposed and not getattr(a, "expose", False):  # a profile's host beyond loopback needs the user's word (issue 15)
        raise BadInput(f"profile {p.name!r}: {exposed}")
    apply_api_key_file(a)
    try:
        p = p.updated(server=cfg.to_vllm_config(), env=dict(cfg.env), gpus=cfg.gpus)
    except ValueError as e:
        raise BadInput(f"server options: {e}") from None
    # the profile's env: is untrusted (a shared file); the user's own --env is not (issue 15)
    trusted = dict(kv.split("=", 1) for kv in (getattr(a, "env", None) or []) if "=" in kv)
    scr = screen_env(p.env, trusted=trusted, builtin=builtin)
    if scr.refused:
        if not getattr(a, "trust_env", False):
            raise BadInput(str(EnvRefused(scr.refused, CLI_FIX, f"profile {p.name!r}")))
        print("trusting the profile's env (--trust-env): "
              + " ".join(f"{k}={v}" for k, (v, _) in scr.refused.items()), file=sys.stderr, flush=True)
        trusted.update({k: v for k, (v, _) in scr.refused.items()})
    for note in scr.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    env = screen_env(p.env, trusted=trusted, builtin=builtin).env  # what may reach the server
    if env != p.env:
        p = p.updated(env=env)
    return p, cfg, trusted, builtin


def add_sim_options(p: argparse.ArgumentParser) -> None:
    """The simulated rig's options (``--sim-gpu``, ``--sim-gpu-count`` …) of the
    commands that launch ``--engine sim``."""
    p.add_argument("--sim-gpu", help="sim: GPU catalog name, e.g. 'RTX 4090'")
    p.add_argument("--sim-gpu-count", type=int, help="sim: number of GPUs")
    p.add_argument("--sim-time-scale", type=float, help="sim: run k× faster than the wall clock (tests)")
    p.add_argument("--sim-seed", type=int)
    p.add_argument("--sim-perturb", type=perturb_seed, metavar="SEED",
                   help="sim: a hidden 'true rig' whose step-time parameters differ from the planner's by seeded "
                        "factors (0.6–1.6×), not shown — a test bed for tuning (0: none)")
    p.add_argument("--sim-calibrated", action="store_true",
                   help="sim: step with the parameters `vllm-dyno calibrate` saved for these cards")
    p.add_argument("--sim-engine-dies-at-request", type=int, metavar="N",
                   help="sim: the engine dies on the N-th request, as vLLM's does on a fatal error after ready")


def sim_args_from(a: argparse.Namespace) -> list[str]:
    """The sim server's argv from :func:`add_sim_options`' values (those given)."""
    out = []
    for flag, v in (("--sim-gpu", a.sim_gpu), ("--sim-gpu-count", a.sim_gpu_count),
                    ("--sim-time-scale", a.sim_time_scale), ("--sim-seed", a.sim_seed),
                    ("--sim-perturb", getattr(a, "sim_perturb", None))):
        if v is not None:
            out += [flag, str(v)]
    if getattr(a, "sim_calibrated", False):
        out.append("--sim-calibrated")
    if getattr(a, "sim_engine_dies_at_request", None) is not None:
        out += ["--sim-engine-dies-at-request", str(a.sim_engine_dies_at_request)]
    return out
