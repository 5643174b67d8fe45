"""What the subcommands share: the error exit, the server options as a ServerConfig,
the API key file and the ``--expose`` confirmation, writing or printing a text, number
formatting and the per-level table of ``run`` and ``runs show``."""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from app.config import (VLLM_OPTIONS, ConfigError, ServerConfig, config_from_namespace, exposure_lines,
                        number_parser, read_secret_file)
from app.engines import Engine
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


def unsaved_text(problem: str, exported: str | None) -> str:
    """What to tell about a run the run store could not take (a full disk, a read-only
    home): ``problem`` names the store's path and the cause; ``exported``: the --json file
    the results were written to, if any."""
    where = (f"The results are in {exported} and in the table above" if exported else
             "The table above is all there is; add --json PATH (on another disk) to export a run")
    return f"the run is not saved — {problem}. {where}."


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
    dicts (StepStats.model_dump() or RunStore.levels rows); its columns are the figures of
    view CLI (:mod:`app.metrics`), in their units (ms, s: :data:`TABLE_LEGEND`). A tail
    percentile from fewer than P99_MIN_REQUESTS requests carries :data:`FEW_MARK`, a level
    that measured a start-up transient ``*`` (both explained under the table). ``slo``: show
    the SLO column (False when the run had no SLO: "ok" would mean nothing)."""
    # deferred: app.cli.common is imported by every command; the capacity module only by those that print levels
    from app import metrics
    from app.loadgen.capacity import P99_MIN_REQUESTS
    from app.loadgen.stats import is_partial, rate_note

    # open loop: the rate each level achieved (sent ÷ its sending time) beside the offered one (its level)
    rate = any(d.get("mode") == "rate" for d in levels)
    cols = [m for m in metrics.table_columns(metrics.CLI, levels) if slo or m.name != "slo_broken"]
    few_any = unsteady = partial = False
    notes = []
    rows = []
    for d in levels:
        n_ok = d.get("n_ok")
        few = FEW_MARK if n_ok is not None and n_ok < P99_MIN_REQUESTS else ""
        mark = "*" if d.get("steady") is False else ""
        unsteady = unsteady or bool(mark)
        if is_partial(d):
            mark += PARTIAL_MARK
            partial = True
        note = rate_note(d) if rate else None
        if note:
            notes.append(f"! level {d['level']:g}/s: {note}")
        cells = []
        for m in cols:
            text = m.cell(d)
            if m.name == "level":
                text += ("/s" if d.get("mode") == "rate" else "") + mark
            elif m.name == "achieved_rps" and d.get("achieved_rps") is not None and d.get("rate_short"):
                text += "!"
            elif m.tail and m.value(d) is not None and few:
                text += few
                few_any = True
            cells.append("—" if text == metrics.NONE_TEXT else text)
        rows.append(cells)
    heads = [m.cli_heading for m in cols]
    width = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]

    def line(cells: list[str]) -> str:  # numbers right-aligned; the SLO (words) last, left-aligned
        return " ".join(c if cols[i].name == "slo_broken" else c.rjust(width[i]) for i, c in enumerate(cells))

    lines = [line(heads)] + [line(r) for r in rows]
    lines.append(TABLE_LEGEND)
    if any(m.name == "ttfa_p99" for m in cols):
        lines.append("TTFA p99: time to the first answer token, after the model's reasoning tokens, in ms")
    if rate:
        lines.append("level N/s: offered request rate; sent/s: the rate achieved (requests sent ÷ the seconds the "
                     "level sent for)")
    lines.extend(notes)
    if few_any:
        lines.append(f"{FEW_MARK} p99 from fewer than {P99_MIN_REQUESTS} requests (one or none above it)")
    if unsteady:
        lines.append("* the level's window was shorter than its median request: a start-up transient")
    if partial:
        lines.append(f"{PARTIAL_MARK} a partial level: cut short (stopped, or the ramp's time cap); its figures are "
                     "from the part that ran")
    return "\n".join(lines)


def server_table(levels: list[dict]) -> str:
    """The server's own figures per level beside the client's
    (:func:`app.loadgen.server_stats.server_rows`), its legend and what to say once
    (:func:`app.loadgen.server_stats.server_summary`); "" when no level has them and
    nothing needs saying."""
    # deferred: only the commands that print levels need it
    from app.loadgen.server_stats import SERVER_COLUMNS, SERVER_LEGEND, server_rows, server_summary

    rows = server_rows(levels)
    lines = []
    if rows:
        w = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(SERVER_COLUMNS)]
        lines.append("  ".join(c.rjust(w[i]) for i, c in enumerate(SERVER_COLUMNS)))
        lines += ["  ".join(v.rjust(w[i]) for i, v in enumerate(r)) for r in rows]
        lines.append(textwrap.fill(SERVER_LEGEND, 100))
    lines += server_summary(levels)
    return "\n".join(lines)


#: ServerConfig fields that are not vLLM options → the option that sets them
_INTERNAL_FLAGS = {"model": "--model", "gpus": "--gpus", "env": "--env", "extra_args": "--extra", "host": "--host",
                   "port": "--port"}


def option_of(loc: tuple) -> str:
    """The command-line option a ServerConfig validation error is about: the field's
    vLLM flag (``max_num_seqs`` → ``--max-num-seqs``), ``--gpus``/``--env``/``--extra``,
    or "the server options" for an error of the whole configuration."""
    field = str(loc[0]) if loc else ""
    if field in VLLM_OPTIONS:
        return VLLM_OPTIONS[field].flag
    return _INTERNAL_FLAGS.get(field, "the server options")


def config_from_args(a: argparse.Namespace, base: ServerConfig | None = None) -> ServerConfig:
    """Build a ServerConfig from options added by :func:`app.config.add_server_options`
    (over ``base``, see :func:`app.config.config_from_namespace`); exits with the
    validation message (status 2, :class:`BadInput`) on error."""
    try:
        return config_from_namespace(a, base)
    except ValidationError as e:
        msgs = "; ".join(f"{option_of(err['loc'])}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors())
        raise BadInput(f"invalid server options: {msgs}") from None
    except ConfigError as e:
        raise BadInput(str(e)) from None


def cards_from_args(gpu: list[str], count: int | None, world: int, busy_gib: float = 0.0):
    """The cards a planning command plans for, chosen by
    :func:`app.planner.cards.cards_for`: the ``--gpu`` names (one card each; a single
    name × ``count``, default ``world`` = TP × PP), else the cards NVML sees on this
    machine. Exits 2 (:class:`BadInput`) naming ``--gpu`` for a card it cannot plan."""
    # deferred: only the planning commands need it (vllm-dyno starts light)
    from app.planner.cards import NoGpuFound, cards_for
    from app.planner.gpus import UnknownGpuError

    try:
        return cards_for(engine=Engine.VLLM, gpu=gpu or None, count=(count or world) if len(gpu) == 1 else None,
                         busy_gib=busy_gib)
    except NoGpuFound as e:
        raise BadInput(f"{e}: name the cards with --gpu \"RTX 4090\" --count 4") from None
    except UnknownGpuError as e:
        raise BadInput(f"--gpu {e.name!r}: {e}") from None
    except ValueError as e:
        raise BadInput(f"--gpu {e}") from None


# ---------------------------------------------------------------------- argument types
# The one mechanism for checking a command's own options: an argparse ``type`` from
# here. argparse then prints ``vllm-dyno CMD: error: argument --OPTION: MESSAGE`` with
# the usage and exits 2, before anything runs. The server options (``--max-num-seqs`` …)
# are checked by their ServerConfig field, declared once (:func:`config_from_args`).

def number_type(kind: type = float, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False, what: str = "a number",
                example: str = "1") -> Callable[[str], Any]:
    """An argparse ``type``: ``kind`` (int or float) within ``low``..``high`` (open ends
    with ``low_open``/``high_open``); NaN and infinities refused. The error says the
    value, what is wanted (``what``) and an ``example`` (:func:`app.config.number_parser`)."""
    return argparse_type(number_parser(kind, low=low, high=high, low_open=low_open, high_open=high_open,
                                       what=what, example=example))


def argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from a parser that raises ValueError saying what is wanted
    (argparse names the option before it)."""
    def typed(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


#: a duration in seconds > 0 (``--startup-timeout``, ``--grace``, ``--step-seconds`` …)
positive_seconds = number_type(float, low=0, low_open=True, what="a number of seconds", example="60")
#: a duration in seconds ≥ 0 (``--warmup-seconds``, ``--silent-for``)
seconds = number_type(float, low=0, what="a number of seconds", example="0")
#: a whole number ≥ 1 (counts of users, requests, cards, tokens)
positive_int = number_type(int, low=1, what="a whole number", example="8")
#: a seed: a whole number in 0 .. 2³²−1 (NumPy's range)
seed_number = number_type(int, low=0, high=2**32 - 1, what="a seed (a whole number)", example="0")
#: a fraction in 0..1 (failure rates)
fraction = number_type(float, low=0, high=1, what="a fraction", example="0.05")
#: a number > 0 (rates, levels, scales, GiB)
positive_number = number_type(float, low=0, low_open=True, what="a number", example="1")
#: a number ≥ 0 (prices, GiB held, temperature)
non_negative = number_type(float, low=0, what="a number", example="0")
#: a process id or group id (≥ 1)
process_id = number_type(int, low=1, what="a process id", example="12345")
#: a run id (``vllm-dyno runs list``)
run_number = number_type(int, low=1, what="a run id (vllm-dyno runs list)", example="3")


def number_list(kind: type = float, *, what: str = "levels", example: str = "1,2,4,8") -> Callable[[str], list]:
    """An argparse ``type``: comma-separated numbers > 0 (``--levels``, ``--rate``), at least one."""
    one = number_type(kind, low=0, low_open=True, what="a number" if kind is float else "a whole number",
                      example=example.split(",")[0])

    def parse(text: str) -> list:
        parts = [x.strip() for x in str(text).split(",") if x.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{text!r}: give {what} separated by commas, e.g. {example}")
        try:
            return [one(x) for x in parts]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e}; write {what} separated by commas, e.g. {example}") \
                from None

    parse.__name__ = what
    return parse


def index_list(text: str) -> list[int]:
    """An argparse ``type``: GPU indices ``0,1,2,3`` (whole numbers ≥ 0, at least one)."""
    parts = [x.strip() for x in str(text).split(",") if x.strip()]
    try:
        out = [int(x) for x in parts]
    except ValueError:
        out = []
    if not parts or not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: write GPU indices separated by commas, e.g. 0,1,2,3")
    return out


def http_url(text: str) -> str:
    """An argparse ``type``: a server's base URL, ``http(s)://HOST[:PORT]`` (trailing ``/``
    dropped)."""
    # deferred: only the commands that take a URL parse one
    import urllib.parse

    u = urllib.parse.urlsplit(str(text).strip())
    try:
        port_ok = u.port is None or 0 < u.port
    except ValueError:
        port_ok = False
    if u.scheme not in ("http", "https") or not u.hostname or not port_ok:
        raise argparse.ArgumentTypeError(f"{text!r}: write the server's base URL, e.g. http://127.0.0.1:8000")
    return str(text).strip().rstrip("/")


def executable(text: str) -> str:
    """An argparse ``type``: an interpreter to run (``--python``): an executable file, or
    a command found on PATH (``python3``)."""
    # deferred: only the commands with --python look one up
    import shutil

    p = Path(text).expanduser()
    if os.sep in text or p.exists():
        if not p.is_file():
            raise argparse.ArgumentTypeError(f"{text}: no such file; give the path of a Python with vLLM, "
                                             "e.g. ~/vllm-env/bin/python")
        if not os.access(p, os.X_OK):
            raise argparse.ArgumentTypeError(f"{text}: not executable (chmod +x, or give another interpreter)")
        return str(p)
    if shutil.which(text) is None:
        raise argparse.ArgumentTypeError(f"{text}: not found on PATH; give the interpreter's path")
    return text


def vllm_version(text: str) -> str:
    """An argparse ``type``: a vLLM version such as ``0.32.0`` (a local part ``+cpu`` allowed)."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?([.+-]?[0-9A-Za-z.+-]*)?", str(text).strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a vLLM version, e.g. 0.32.0")
    return str(text).strip()


def link_name(text: str) -> str:
    """An argparse ``type``: an inter-host link of the link catalog (``ib-hdr200``,
    ``10gbe`` …; ``vllm-dyno plan --list-gpus`` lists them) → its catalog name."""
    # deferred: the catalog is read only when the option is given
    from app.planner.gpus import UnknownLinkError, lookup_link

    try:
        return lookup_link(text).name
    except UnknownLinkError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def from_parser(parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse ``type`` from a parser that raises ValueError with the reason
    (e.g. :func:`app.loadgen.spec.parse_length`)."""
    def typed(text: str):
        try:
            return parse(text)
        except (ValueError, OverflowError) as e:
            raise argparse.ArgumentTypeError(str(e) or f"{text!r} is not {what}") from None

    typed.__name__ = what
    return typed


def output_file(text: str) -> str:
    """An argparse ``type``: a file to write (an export): its folder must exist and be
    writable, and the path must not be a folder — checked before the command runs, not
    after a ramp."""
    p = Path(text).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder; give a file name, e.g. {p / 'out.json'}")
    parent = p.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {parent} does not exist; create it or give another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text}: not writable by this user; give another path")
    return str(p)


def input_file(text: str) -> str:
    """An argparse ``type``: an existing, readable file (``-`` for stdin is passed through)."""
    if text == "-":
        return text
    p = Path(text).expanduser()
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder; give a file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable by this user")
    return str(p)


def add_ssh_options(parser: argparse.ArgumentParser) -> None:
    """How the hosts of a rig are reached over SSH (``hosts check``, ``run`` and ``tune``
    with a profile's ``hosts:``): ``--known-hosts``, ``--identity`` (repeatable), ``--ssh-config``
    (repeatable); read back with :func:`ssh_options`. Keys only: a password is never asked
    for nor stored (app.hosts.link.SshOptions)."""
    parser.add_argument("--known-hosts", type=input_file, metavar="FILE",
                        help="known-hosts file the hosts' keys are checked against (default: ~/.ssh/known_hosts)")
    parser.add_argument("--identity", type=input_file, action="append", metavar="FILE",
                        help="private key file for the hosts (repeatable; default: your SSH agent and ~/.ssh)")
    parser.add_argument("--ssh-config", type=input_file, action="append", metavar="FILE",
                        help="ssh_config file (repeatable; default: ~/.ssh/config)")


def ssh_options(a: argparse.Namespace):
    """The :class:`app.hosts.link.SshOptions` of :func:`add_ssh_options`' options; None
    when none was given (the user's SSH agent, config and known hosts)."""
    known, keys, conf = getattr(a, "known_hosts", None), getattr(a, "identity", None), getattr(a, "ssh_config", None)
    if not (known or keys or conf):
        return None
    # deferred: asyncssh loads only for a command that reaches hosts
    from app.hosts.link import SshOptions

    return SshOptions(known_hosts=known, client_keys=tuple(keys) if keys else None,
                      config=tuple(conf) if conf else None)


def rig_exposure_problem(what: str, hosts: list, expose: bool) -> str | None:
    """Why a launch over ``hosts`` (a profile's ``hosts:``, two or more; ``what``:
    ``profile 'NAME'``, ``tune 3``) may not go on
    without ``--expose`` (None: one host, or confirmed): the head's API server binds the
    head's address, beyond loopback, for the load generator and the other hosts to reach
    it (issue 15's confirmation). ``run`` and ``tune`` refuse with it (exit 2) before any
    host is reached."""
    if len(hosts) < 2 or expose:
        return None
    return (f"{what} runs over {len(hosts)} hosts: the head's API server binds "
            f"{hosts[0].reach} (beyond loopback, for the ramp and the other hosts to reach it); "
            "confirm with --expose")


def rig_row_text(row: dict) -> str:
    """One host of a rig as a line (a row of RunController.rig_status): its destination,
    role and rank, state (and why it failed or was lost), host name, cards (the CPU build:
    none), clock offset ± its bound and the round trip, ms."""
    role = f"{row['role']}" + (f" rank {row['rank']}" if row.get("rank") is not None else "") if row.get("role") \
        else "not in the plan"
    state = row["state"] + (f" ({row['reason']})" if row.get("reason") else "")
    cards = ", ".join(row.get("cards") or []) or "no GPU (CPU)"
    off = ("clock offset not measured" if row.get("offset_s") is None else
           f"clock offset {row['offset_s'] * 1e3:+.2f} ± {row['bound_s'] * 1e3:.2f} ms (round trip "
           f"{row['rtt_s'] * 1e3:.2f} ms)")
    return f"host {row['host']}: {role}, {state} — {row.get('hostname') or '?'}, {cards}; {off}"


def part_lines(part: dict) -> list[str]:
    """One host's part of a recorded rig run (a row of the run's ``config["hosts"]``, as
    app.run.controller ``RunController._attach_run`` records it): ``host DEST: ROLE, rank
    R``, the argv its agent ran (shell-quoted, secrets redacted as the store keeps them),
    then the CPU build's defaults its agent filled in (the flags and why each), if any."""
    # deferred: only `runs show` of a rig run needs it (vllm-dyno starts light)
    from app.planner.plan import fix_to_flags

    rank = f", rank {part['rank']}" if part.get("rank") is not None else ""
    out = [f"host {part.get('host') or '?'}: {part.get('role') or '?'}{rank}"]
    argv = part.get("argv") or []
    out.append("    argv: " + (shlex.join(argv) if argv else "(not recorded: the part did not start)"))
    d = part.get("defaults") or {}
    if d.get("fix"):
        out.append(f"    CPU-build defaults filled in by its agent: {fix_to_flags(d['fix'])}")
        out += [f"      {c}" for c in d.get("chosen") or []]
    out += [f"    CPU build of vLLM: {n}" for n in d.get("notes") or []]
    return out


def profile_for_launch(a: argparse.Namespace):
    """The profile ``a.profile`` (a library name or a YAML file) for a command that
    launches it (``run``, ``tune``): the vLLM options and the sim rig's options given on
    the command line override its own (a rig option on a profile of another engine is
    refused, unless ``--engine sim`` is given), ``--api-key-file`` is applied, a host
    beyond loopback needs ``--expose`` and its ``env:`` is screened (a shared file: loader
    and interpreter variables need ``--trust-env``; app.profiles.env_policy) — the profile returned holds only what may
    reach the server. Returns ``(profile, config, trusted, builtin)``
    — ``trusted`` the pairs the user confirmed, ``builtin`` whether it ships with the app.
    Raises :class:`BadInput` naming the profile and the fix."""
    # deferred: only the launching commands need the profile library
    from app.config import exposure_problem
    from app.profiles import ProfileLibrary, ProfileNotFound, read_profile
    from app.profiles.env_policy import CLI_FIX, EnvRefused, screen_env
    from app.profiles.io import ProfileError
    from app.profiles.model import SIM_RIG_OPTIONS

    builtin = False
    try:
        if a.profile.endswith((".yaml", ".yml")) and os.path.isfile(a.profile):
            p = read_profile(a.profile)
        else:
            entry = ProfileLibrary().entry(a.profile)
            p, builtin = entry.profile, entry.read_only
    except (ProfileError, ProfileNotFound) as e:
        raise BadInput(str(e)) from None
    rig = sim_rig_overrides(a)
    if rig:  # the rig's options given here override the profile's sim: block
        engine = Engine.parse(getattr(a, "engine", None) or p.engine)
        if engine is None or not engine.simulated:
            flags = ", ".join(SIM_RIG_OPTIONS[k].flag for k in rig)
            raise BadInput(f"{flags}: options of the simulated rig, and profile {p.name!r} runs engine {p.engine}"
                           + (" (add --engine sim)" if hasattr(a, "engine") else ""))
        try:
            p = p.updated(engine=Engine.SIM, sim={**(p.sim.model_dump() if p.sim is not None else {}), **rig})
        except ValueError as e:
            raise BadInput(f"sim options: {e}") from None
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


def spec_acceptance(text: str) -> float:
    """argparse type: ``--sim-spec-acceptance``, a probability in [0, 1]."""
    # deferred: only the commands that launch the sim take it
    from app.engine.specdecode import check_acceptance

    try:
        return check_acceptance(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).split(" ", 2)[-1]) from None


def add_sim_rig_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The simulated rig's options (``--sim-gpu``, ``--sim-gpu-count``, ``--sim-cooling`` …),
    generated from their one declaration (:data:`app.profiles.model.SIM_RIG_OPTIONS`):
    ``dest`` ``sim_…``, default None (not given), the value checked as a profile's is.
    Read them back with :func:`sim_rig_overrides` or :func:`sim_args_from`."""
    # deferred: the profile model only for the commands that describe a rig
    from app.profiles.model import SIM_RIG_OPTIONS

    for opt in SIM_RIG_OPTIONS.values():
        p.add_argument(opt.flag, dest=opt.dest, type=argparse_type(opt.parse), metavar=opt.metavar,
                       help=("sim: " + opt.help).replace("%", "%%"))


def add_sim_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that launch ``--engine sim`` (``serve``, ``tune``): the
    rig's (:func:`add_sim_rig_options`) and the launch's own test switches."""
    add_sim_rig_options(p)
    p.add_argument("--sim-calibrated", action="store_true",
                   help="sim: step with the parameters `vllm-dyno calibrate` saved for these cards")
    p.add_argument("--sim-engine-dies-at-request", type=positive_int, metavar="N",
                   help="sim: the engine dies on the N-th request, as vLLM's does on a fatal error after ready")


def sim_rig_overrides(a: argparse.Namespace) -> dict[str, Any]:
    """The rig options given on the command line: SimRig field → value (those given)."""
    # deferred: the profile model only for the commands that describe a rig
    from app.profiles.model import SIM_RIG_OPTIONS

    return {name: v for name, opt in SIM_RIG_OPTIONS.items() if (v := getattr(a, opt.dest, None)) is not None}


def sim_args_from(a: argparse.Namespace) -> list[str]:
    """The sim server's argv from :func:`add_sim_options`' values (those given)."""
    # deferred: the profile model only for the commands that describe a rig
    from app.profiles.model import SIM_RIG_OPTIONS

    out = []
    for name, v in sim_rig_overrides(a).items():
        opt = SIM_RIG_OPTIONS[name]
        out += [opt.flag, opt.text(v)]
    if getattr(a, "sim_calibrated", False):
        out.append("--sim-calibrated")
    if getattr(a, "sim_engine_dies_at_request", None) is not None:
        out += ["--sim-engine-dies-at-request", str(a.sim_engine_dies_at_request)]
    return out


def dataset_source(text: str) -> str:
    """argparse type of ``--prompts-file``: ``builtin:NAME`` and ``hf:OWNER/NAME`` as
    given (checked when the dataset is read), otherwise an existing readable file."""
    if text.startswith(("builtin:", "hf:")):  # app.loadgen.datasets.BUILTIN, HF
        return text
    return input_file(text)


def add_workload_options(p: argparse.ArgumentParser | argparse._ArgumentGroup, command: str) -> None:
    """The workload's options of ``command`` (``ramp``, ``run``, ``plan``, ``tune``),
    generated from the kinds' declarations (:func:`app.loadgen.workload.cli_options`:
    ``--prompt-tokens`` … ``--prompts-file`` … ``--multi-turn``, ``--shared-prefix``, the
    request-rate ones where the command runs request rates, ``--seed``); each defaults to
    "not given" (the base workload's value). :func:`workload_kw` reads them back."""
    # deferred: the load generator's workload only for the commands that take one
    from app.loadgen.workload import cli_options

    for o in cli_options(command):
        help_ = o.help.replace("%", "%%")
        if o.source:  # a file that must exist, or builtin:/hf: (checked when read)
            p.add_argument(o.flag, type=dataset_source, metavar=o.metavar, help=help_)
        elif o.switch:
            p.add_argument(o.flag, action="store_true", help=help_)
        else:
            p.add_argument(o.flag, type=from_parser(o.parse, o.metavar or "a value") if o.parse else None,
                           choices=o.choices, metavar=o.metavar, help=help_)


def workload_kw(a: argparse.Namespace, command: str) -> dict:
    """The Workload fields of :func:`add_workload_options`' options that were given (the
    workloads as their pydantic models, the dataset's as strings). A dataset is read here,
    so that a bad one is an error naming ``--prompts-file`` (ValueError)."""
    # deferred: the load generator's workload only for the commands that take one
    from app.loadgen.workload import fields_from_args

    return fields_from_args(a, command)
