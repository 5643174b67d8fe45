"""``vllm-dyno runs`` (the run history: list, show, export, delete) and ``vllm-dyno run``
(a profile headless through the run controller: plan, launch, ramp, record, stop).

Exit status: 0 success; 1 the run or the operation failed; 2 bad input; 130
interrupted.
"""
from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import threading

from app.cli.common import (
    BadInput,
    add_security_options,
    add_sim_rig_options,
    add_ssh_options,
    add_workload_options,
    workload_kw,
    err,
    executable,
    fmt,
    level_table,
    number_list,
    output_file,
    part_lines,
    positive_seconds,
    print_exposure,
    profile_for_launch,
    rig_exposure_problem,
    run_number,
    rig_row_text,
    server_table,
    ssh_options,
    unsaved_text,
    write_or_print,
)
from app.config import add_server_options
from app.loadgen.stats import turns_text


def cmd_runs(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app import history
    from app.store import RunStore

    try:
        with RunStore() as store:
            if a.action == "list":
                rows = history.list_runs(store)
                if not rows:
                    print("no runs recorded yet")
                print(f"{'id':>5}  {'when':<16}  {'engine':<6}  {'status':<12}  {'GPUs':>4}  {'peak tok/s':>10}  name")
                for r in rows:
                    print(f"{r.id:>5}  {r.created_text:<16}  {r.engine:<6}  {r.status:<12}  "
                          f"{r.gpu_count or '—':>4}  {fmt(r.peak_output_tps):>10}  {r.name}")
                return 0
            if a.action == "show":
                r = history.get_run(store, a.id)
                s = r.get("summary") or {}
                print(f"run {r['id']}: {r['name']}  engine {r['engine']}  status {r['status']}")
                if s.get("stop_reason"):
                    print(f"  {s['stop_reason']}")
                if s.get("hardware"):
                    # deferred: only this command needs it (vllm-dyno starts light)
                    from app.profiles.model import HardwareFingerprint

                    print(f"  hardware: {HardwareFingerprint.model_validate(s['hardware']).describe()}")
                parts = (r.get("config") or {}).get("hosts") or []
                if parts:  # a rig's run: what each host ran, as its agent reported it
                    print(f"  parts over {len({p.get('host') for p in parts})} hosts:")
                    for p in parts:
                        print("\n".join("    " + ln for ln in part_lines(p)))
                cap = r.get("capacity") or {}
                if cap.get("kv_cache_tokens") is not None:
                    print(f"  KV cache: {cap['kv_cache_tokens']:,} tokens; max concurrency "
                          f"{cap.get('max_concurrency')}")
                slo = ((r.get("spec") or {}).get("slo") or {})
                print(level_table(r["levels"], slo=any(v is not None for v in slo.values())))
                if any(d.get("server") for d in r["levels"]):  # runs before issue 20 have no server figures
                    print(server_table(r["levels"]))
                knee = s.get("knee")
                if knee:
                    print(f"knee at {knee['level']:g}")
                if (s.get("verdict") or {}).get("sentence"):
                    print("\n" + s["verdict"]["sentence"])
                return 0
            if a.action == "export":
                if a.format == "html":
                    # deferred: only this command needs it (vllm-dyno starts light)
                    from app.report import run_report

                    history.get_run(store, a.id)  # RunNotFound, named, before rendering
                    text = run_report(store, a.id)
                elif a.format == "json":
                    text = json.dumps(history.export_json(store, a.id), indent=1, default=str)
                elif a.what == "requests":
                    text = history.requests_csv(store, a.id)
                else:
                    text = history.levels_csv(store, a.id)
                write_or_print(text, a.output)
                return 0
            if a.action == "delete":
                history.delete_run(store, a.id)
                print(f"deleted run {a.id}")
                return 0
    except history.RunNotFound as e:
        return err(str(e))
    except (OSError, sqlite3.OperationalError) as e:  # an export's file; app.store.StoreWriteError: the
        # store cannot be written (a full disk, a read-only home), with the path and the cause
        print(f"vllm-dyno runs: {e}", file=sys.stderr)
        return 1
    return err(f"unknown action {a.action}")



def cmd_run(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.profiles import ProfileLibrary
    from app.run.profile_run import Phase, ProfileRun

    try:
        p, cfg, trusted, builtin = profile_for_launch(a)
    except BadInput as e:
        return int(e.code or 2)
    unconfirmed = rig_exposure_problem(f"profile {p.name!r}", list(p.hosts), a.expose) if p.engine.launches else None
    if unconfirmed:  # refused here, before any host is reached
        return err(unconfirmed)
    over: dict = {}
    if a.levels:
        over["levels"] = a.levels
    if a.rate:  # open loop: request rates in req/s instead of the profile's users
        over.update(mode="rate", levels=a.rate, max_level=None, search=None)
    if a.step_seconds is not None:
        over["step_seconds"] = a.step_seconds
    if a.max_total_seconds is not None:
        over["max_total_seconds"] = a.max_total_seconds
    try:
        over.update({k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in workload_kw(a, "run").items()})
    except ValueError as e:
        return err(f"ramp options: {e}")
    if over:
        try:
            p.ramp_spec("http://127.0.0.1:1", None, **over)
        except ValueError as e:
            return err(f"ramp options: {e}")

    def on_phase(ph: Phase, msg: str) -> None:
        print(f"[{ph.value}]" + (f" {msg}" if msg else ""), flush=True)
        sup = s.supervisor
        if ph == Phase.READY and sup is not None:
            print_exposure(cfg, sup.config.port)
        if ph == Phase.READY:
            for row in s.rig_status():  # a rig: each host's role, state, cards and clock offset
                print(f"  {rig_row_text(row)}", flush=True)

    def on_part(part: dict) -> None:
        print(f"  host {part['host']}: {part['role']} part started (rank {part['rank']}, process group {part.get('pgid')})"
              + (f" → {part['url']}" if part["role"] == "head" and part.get("url") else ""), flush=True)

    def on_level(st) -> None:
        sent = ("" if st.achieved_rps is None else f", sent {st.achieved_rps:.2f} of {st.level:g} req/s"
                + (f" (short: {st.rate_short})" if st.rate_short else ""))
        print(f"  level {st.level:g}: {st.output_tps:.1f} out tok/s, TTFT p99 "
              f"{fmt(st.ttft_p99, 0, 1e3)} ms, failures {st.failure_rate * 100:.1f}%{sent}", flush=True)

    def on_line(stream: str, text: str, t: float) -> None:
        if a.show_log:
            print(f"  | {text}", flush=True)

    def on_defaults(d) -> None:
        for line in d.lines():
            print(line, flush=True)

    s = ProfileRun(p, python=a.python, ramp_overrides=over, force=a.force, startup_timeout=a.startup_timeout,
                   expose=a.expose, on_phase=on_phase, on_level=on_level, on_line=on_line, on_defaults=on_defaults,
                   on_part=on_part, trusted_env=trusted, builtin=builtin, ssh=ssh_options(a))
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("res", s.run()), name="session", daemon=True)
    interrupted = threading.Event()

    def on_sig(*_):
        interrupted.set()
        s.abort()

    prev = signal.signal(signal.SIGINT, on_sig)
    prev_t = signal.signal(signal.SIGTERM, on_sig)
    t.start()
    try:
        while t.is_alive():
            t.join(0.2)
    finally:
        signal.signal(signal.SIGINT, prev)
        signal.signal(signal.SIGTERM, prev_t)
    res = box.get("res")
    if res is None:
        print("vllm-dyno run: the session ended without a result (see the log above)", file=sys.stderr)
        return 1
    print()
    if res.steps:
        print(level_table([st.model_dump() for st in res.steps], slo=not p.ramp.slo.is_empty()))
        server = server_table([st.model_dump() for st in res.steps])
        if server:
            print("\nthe server's own figures (/metrics):\n" + server)
        for st in res.steps:  # a multi-turn ramp: TTFT by conversation turn
            if st.turns:
                print(f"  level {st.level:g}, TTFT p50/p99 by turn: {turns_text(st.turns)}")
    if res.knee:
        print(res.knee.describe())
    print(f"status: {res.status}" + (f" — {res.reason}" if res.reason else ""))
    if res.verdict is not None:
        print("\n" + res.verdict.sentence)
    if res.run_id is not None:
        print(f"recorded as run {res.run_id} (vllm-dyno runs show {res.run_id})")
    code = 0
    if a.json and res.outcome is not None:
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.loadgen import export

        try:
            export.write_json(a.json, res.outcome, res.outcome_spec, time_scale=res.time_scale)
            print(f"wrote {a.json}", file=sys.stderr)
        except OSError as e:
            print(f"vllm-dyno run: cannot write {a.json}: {e.strerror or e}", file=sys.stderr)
            code = 1
    if res.unsaved:
        print(f"vllm-dyno run: {unsaved_text(res.unsaved, a.json if code == 0 else None)}", file=sys.stderr)
        code = 1
    if a.save_results and res.run_id is not None and res.steps:
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.history import profile_from_run
        from app.store import RunStore

        try:
            with RunStore() as store:
                saved = profile_from_run(store, res.run_id, p.name)
            path = ProfileLibrary().save(saved)
            print(f"results saved with profile {saved.name!r} → {path}")
        except OSError as e:
            print(f"vllm-dyno run: cannot save the results into the profile: {e}", file=sys.stderr)
            code = 1
    if interrupted.is_set():
        return 130
    return code if res.ok else 1


def register(sub) -> None:
    r = sub.add_parser("runs", help="run history: list, show, export, delete")
    rs = r.add_subparsers(dest="action", required=True)
    rs.add_parser("list", help="recorded runs, newest first")
    x = rs.add_parser("show", help="a run's outcome and per-level table")
    x.add_argument("id", type=run_number)
    x = rs.add_parser("export", help="a run as JSON (everything), CSV (levels or requests) or one self-contained "
                                     "HTML report (verdict, flags, rig, levels, curves, telemetry)")
    x.add_argument("id", type=run_number)
    x.add_argument("--format", choices=["json", "csv", "html"], default="json")
    x.add_argument("--what", choices=["levels", "requests"], default="levels", help="csv: which table")
    x.add_argument("-o", "--output", type=output_file, help="write to this file instead of stdout")
    x = rs.add_parser("delete", help="delete a run and everything recorded with it")
    x.add_argument("id", type=run_number)
    r.set_defaults(func=cmd_runs)


    x = sub.add_parser("run", help="run a profile headless: plan, launch, ramp, record, stop, print the table")
    x.add_argument("profile", help="profile name (see `profiles list`) or a profile YAML file")
    add_server_options(x, model_required=False)  # override the profile's vLLM options
    add_sim_rig_options(x.add_argument_group("the simulated rig (a profile of engine sim; override its sim: block)"))
    add_security_options(x)
    add_ssh_options(x)  # a profile with hosts: how they are reached (as `hosts check`)
    x.add_argument("--python", type=executable, help="interpreter with vLLM installed (engine vllm)")
    g = x.add_mutually_exclusive_group()
    g.add_argument("--levels", type=number_list(), help="override the ramp's levels, e.g. 1,2,4")
    g.add_argument("--rate", type=number_list(what="request rates (req/s)", example="0.5,1,2,4"),
                   help="run open-loop request rates in req/s instead of the profile's levels, e.g. 0.5,1,2,4")
    x.add_argument("--step-seconds", type=positive_seconds, help="override the seconds per level")
    x.add_argument("--max-total-seconds", type=positive_seconds, help="cap the whole ramp")
    add_workload_options(x, "run")  # the workload's kinds, over the profile's ramp
    x.add_argument("--startup-timeout", type=positive_seconds, default=900.0, help="seconds to wait for the server")
    x.add_argument("--force", action="store_true", help="launch even when the planner says it cannot work")
    x.add_argument("--trust-env", action="store_true",
                   help="let the profile's env: set variables a shared profile may not set unconfirmed "
                        "(LD_PRELOAD, PYTHONPATH, PATH, …; the refusal shows the exact values)")
    x.add_argument("--show-log", action="store_true", help="echo the server's log")
    x.add_argument("--save-results", action="store_true", help="save the results into the profile (user copy)")
    x.add_argument("--json", type=output_file,
                   help="also write the results (spec, summary, levels, verdict) as JSON here — e.g. on another "
                        "disk when the data directory's is full")
    x.set_defaults(func=cmd_run)
