"""``vllm-dyno serve`` and ``vllm-dyno cleanup``: a server in the foreground, through the
run controller (the same launch, telemetry-free, and the same diagnosis of a failed
launch as the window and ``vllm-dyno run``); Ctrl-C stops it and checks that no process
of its group is left."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from app.cli.common import (
    add_security_options,
    add_sim_options,
    apply_api_key_file,
    config_from_args,
    err,
    executable,
    positive_seconds,
    print_exposure,
    sim_args_from,
)
from app.config import add_server_options, exposure_problem
from app.engines import SERVABLE, Engine
from app.run.events import RunListener, State


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="launch and supervise a server in the foreground (Ctrl-C stops it)")
    add_server_options(p)
    add_security_options(p)
    p.add_argument("--engine", choices=[e.value for e in SERVABLE], default=Engine.VLLM.value)
    p.add_argument("--python", type=executable, help="interpreter with vLLM installed (default: VLLM_DYNO_VLLM_PYTHON, .venv-vllm, python3)")
    p.add_argument("--startup-timeout", type=positive_seconds, default=900.0, help="seconds to wait for ready")
    p.add_argument("--grace", type=positive_seconds, default=20.0, help="seconds between SIGTERM and SIGKILL on stop")
    p.add_argument("--quiet-log", action="store_true", help="do not echo the server's log")
    add_sim_options(p)
    p.set_defaults(func=cmd_serve)

    c = sub.add_parser("cleanup", help="list vLLM processes and end the leftovers of vLLM Dyno sessions that are "
                                       "gone (--yes); a running session's server is never ended")
    c.add_argument("--yes", action="store_true", help="end the leftovers without asking")
    c.add_argument("--include-unmanaged", action="store_true",
                   help="also end vLLM processes not started by vLLM Dyno (e.g. a `vllm serve` in a terminal)")
    c.set_defaults(func=cmd_cleanup)


class _Printer(RunListener):
    """The controller's news on the terminal."""

    def __init__(self, ctl, show_log: bool, done: threading.Event) -> None:
        self.ctl, self.show_log, self.done = ctl, show_log, done

    def on_state(self, state: State, reason: str) -> None:
        t = self.ctl.clock.now()
        print(f"[{t:8.2f} s] state: {state.value}" + (f" — {reason}" if reason and state != State.FAILED else ""),
              flush=True)
        sup = self.ctl.supervisor
        if state == State.READY and sup is not None:
            f = sup.parser.facts
            print(f"  url: {sup.url}   vLLM {f.version or '?'}", flush=True)
            print_exposure(sup.config)
            if f.kv_cache_tokens is not None:
                print(f"  {f.kv_cache_device or 'GPU'} KV cache size: {f.kv_cache_tokens:,} tokens", flush=True)
            if f.max_concurrency is not None:
                print(f"  maximum concurrency for {f.max_concurrency_tokens_per_request:,} tokens per request: "
                      f"{f.max_concurrency:.2f}x", flush=True)
            for k, label in (("model_loading_gib", "model loading GiB"),
                             ("available_kv_cache_gib", "available KV cache GiB"), ("engine_init_s", "engine init s")):
                v = getattr(f, k)
                if v is not None:
                    print(f"  {label}: {v}", flush=True)
        if state in (State.STOPPED, State.IDLE):
            self.done.set()

    def on_launch_phase(self, progress) -> None:
        if progress.phase != "ready":  # the ready state is printed next
            print(f"[{self.ctl.clock.now():8.2f} s] launch: {progress.text()}", flush=True)

    def on_launch_defaults(self, defaults) -> None:
        for line in defaults.lines():
            print(line, flush=True)

    def on_line(self, stream: str, text: str, t: float) -> None:
        if self.show_log:
            print(f"  | {text}", flush=True)

    def on_launch_failed(self, reason: str, diagnosis) -> None:
        print(f"  failed: {reason}", flush=True)
        sup = self.ctl.supervisor
        tail = sup.log_tail(20) if sup is not None else []
        if tail:
            print("  last log lines:\n    " + "\n    ".join(tail), flush=True)
        if diagnosis is not None:
            print("  " + diagnosis.summary(), flush=True)
        self.done.set()


def cmd_serve(a: argparse.Namespace) -> int:
    # deferred: only this command needs the run controller (vllm-dyno starts light)
    from app.run.controller import RunController
    from app.run.target import launch_target
    from app.server.launch import LaunchError

    cfg = config_from_args(a)
    exposed = exposure_problem(cfg.host)
    if exposed and not a.expose:  # binding beyond loopback needs the user's word (issue 15)
        return err(exposed)
    apply_api_key_file(a)
    done = threading.Event()
    ctl = RunController()
    ctl.listener = _Printer(ctl, not a.quiet_log, done)
    target = launch_target(a.engine, cfg, python=a.python, sim_args=sim_args_from(a),
                           telemetry=False, startup_timeout=a.startup_timeout, grace=a.grace, expose=a.expose)
    try:
        ctl.launch(target, check_leftovers=False)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stop_req = threading.Event()
    prev = signal.signal(signal.SIGINT, lambda *_: stop_req.set())
    prev_t = signal.signal(signal.SIGTERM, lambda *_: stop_req.set())
    try:
        while not done.is_set() and not stop_req.is_set():
            done.wait(0.2)
    finally:
        failed = ctl.state == State.FAILED
        left = ctl.close()
        signal.signal(signal.SIGINT, prev)
        signal.signal(signal.SIGTERM, prev_t)
    if left:
        print(f"warning: processes of the server group still alive: {left}", file=sys.stderr)
        return 1
    print("no process of the server group is left", flush=True)
    return 1 if failed else 0


def cmd_cleanup(a: argparse.Namespace) -> int:
    """List every vLLM process with whose it is; end the leftovers (``orphaned``: the
    vLLM Dyno that started them is gone), plus those not started by vLLM Dyno with
    ``--include-unmanaged``; a process a running vLLM Dyno owns is never ended
    (app.server.procs.find_leftovers)."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.server.procs import end_leftovers, find_leftovers

    found = find_leftovers()
    if not found:
        print("no vLLM processes")
        return 0
    print(f"{'pid':>8}  {'GPU memory':>12}  {'RSS':>10}  title — whose")
    for p in found:
        gpu = "n/a (no NVML)" if p.gpu_bytes is None else f"{p.gpu_bytes / 2**30:.2f} GiB"
        print(f"{p.pid:>8}  {gpu:>12}  {p.rss_bytes / 2**30:7.2f} GiB  {p.title} — {p.describe()}")
    kinds = ("orphaned", "unmanaged") if a.include_unmanaged else ("orphaned",)
    left = [p for p in found if p.kind in kinds]
    unmanaged = sum(p.kind == "unmanaged" for p in found)
    if not left:
        print("no leftovers to end" + (f" ({unmanaged} process(es) not started by vLLM Dyno: end them with "
                                        "--include-unmanaged)" if unmanaged and not a.include_unmanaged else ""))
        return 0
    if not a.yes:
        if not sys.stdin.isatty():
            print("run again with --yes to end the leftovers")
            return 1
        if input(f"end these {len(left)} processes? [y/N] ").strip().lower() not in ("y", "yes"):
            return 1
    alive = end_leftovers(left, include_unmanaged=a.include_unmanaged)
    print(f"ended {len(left) - len(alive)} process(es)" + (f"; still alive: {alive}" if alive else ""))
    if unmanaged and not a.include_unmanaged:
        print(f"left alone: {unmanaged} process(es) not started by vLLM Dyno (--include-unmanaged ends them)")
    return 0 if not alive else 1
