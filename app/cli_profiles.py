"""``vllm-dyno profiles | runs | compare | run``: profiles, run history, comparisons and
the headless run of a profile.

Exit status: 0 success; 1 the run or the operation failed; 2 bad input (unknown
profile or run, unreadable file); 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from app.profiles.io import ProfileError


def _err(msg: str) -> int:
    print(f"vllm-dyno: {msg}", file=sys.stderr)
    return 2


def _write_or_print(text: str, out: str | None) -> None:
    if out:
        from app.profiles.io import write_atomic

        write_atomic(out, text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _fmt(v, nd: int = 1, scale: float = 1.0) -> str:
    return "—" if v is None else f"{v * scale:.{nd}f}"


def level_table(levels: list[dict]) -> str:
    """The per-level table printed by ``run`` and ``runs show`` (ms for latencies)."""
    head = f"{'level':>6} {'out tok/s':>10} {'req/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p99':>9} " \
           f"{'ITL p99':>8} {'fail':>6}  SLO"
    lines = [head, "-" * len(head)]
    for d in levels:
        slo = "broken: " + "; ".join(d.get("slo_broken") or []) if d.get("slo_broken") else "ok"
        lines.append(f"{d['level']:>6g} {_fmt(d.get('output_tps')):>10} {_fmt(d.get('rps'), 2):>7} "
                     f"{_fmt(d.get('ttft_p50'), 0, 1e3):>7}ms {_fmt(d.get('ttft_p99'), 0, 1e3):>7}ms "
                     f"{_fmt(d.get('tpot_p99'), 1, 1e3):>7}ms {_fmt(d.get('itl_p99'), 1, 1e3):>6}ms "
                     f"{(d.get('failure_rate') or 0) * 100:>5.1f}%  {slo}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- profiles
def cmd_profiles(a: argparse.Namespace) -> int:
    from app.profiles import (ProfileLibrary, ProfileNotFound, dump_profile, import_text, to_command_line,
                              to_vllm_config_yaml)

    lib = ProfileLibrary()
    try:
        if a.action == "list":
            res = lib.scan()
            for e in res.entries:
                p = e.profile
                tag = "built-in" if e.read_only else ("user, shadows built-in" if e.shadows_builtin else "user")
                hw = p.hardware.describe() if p.hardware else "—"
                print(f"{p.name:<42} {p.engine:<6} {hw:<28} [{tag}]")
                for w in e.warnings:
                    print(f"    warning: {w}")
            for err in res.errors:
                print(f"error: {err}", file=sys.stderr)
            return 0
        if a.action == "show":
            print(dump_profile(lib.get(a.name)), end="")
            return 0
        if a.action == "export":
            p = lib.get(a.name)
            if a.format == "cmd":
                text = to_command_line(p, program=a.program)
            elif a.format == "yaml":
                text = to_vllm_config_yaml(p)
            else:
                text = dump_profile(p)
            _write_or_print(text, a.output)
            return 0
        if a.action == "import":
            if a.file == "-":
                text, label = sys.stdin.read(), "<stdin>"
            else:
                path = Path(a.file)
                from app.profiles.io import read_text_limited

                if not path.is_file():
                    # a pasted command line instead of a file
                    if " " in a.file:
                        text, label = a.file, "<command line>"
                    else:
                        return _err(f"{a.file}: no such file (give a profile YAML, a vLLM --config YAML, "
                                    "a file holding a `vllm serve` command line, or - for stdin)")
                else:
                    text, label = read_text_limited(path), str(path)
            warns: list[str] = []
            p = import_text(text, a.name, label, warns)
            for w in warns:
                print(f"warning: {w}", file=sys.stderr)
            path = lib.save(p, overwrite=a.force)
            print(f"imported profile {p.name!r} → {path}")
            return 0
        if a.action == "delete":
            print(f"deleted {lib.delete(a.name)}")
            return 0
        if a.action == "save-run":
            from app.history import best_run, get_run, profile_from_run
            from app.store import RunStore

            with RunStore() as store:
                rid = a.run_id
                if a.which == "best":  # the best run recorded for the same profile
                    rid = best_run(store, get_run(store, rid)["name"]) or rid
                p = profile_from_run(store, rid, a.name, which=a.which)
            path = lib.save(p, overwrite=a.force)
            print(f"saved run {rid} as profile {p.name!r} → {path}")
            return 0
    except ProfileError as e:
        return _err(str(e))
    except (ProfileNotFound, FileExistsError, PermissionError, LookupError, ValueError) as e:
        return _err(str(e))
    return _err(f"unknown action {a.action}")


# ---------------------------------------------------------------------- runs
def cmd_runs(a: argparse.Namespace) -> int:
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
                          f"{r.gpu_count or '—':>4}  {_fmt(r.peak_output_tps):>10}  {r.name}")
                return 0
            if a.action == "show":
                r = history.get_run(store, a.id)
                s = r.get("summary") or {}
                print(f"run {r['id']}: {r['name']}  engine {r['engine']}  status {r['status']}")
                if s.get("stop_reason"):
                    print(f"  {s['stop_reason']}")
                if s.get("hardware"):
                    from app.profiles.model import HardwareFingerprint

                    print(f"  hardware: {HardwareFingerprint.model_validate(s['hardware']).describe()}")
                cap = r.get("capacity") or {}
                if cap.get("kv_cache_tokens") is not None:
                    print(f"  KV cache: {cap['kv_cache_tokens']:,} tokens; max concurrency "
                          f"{cap.get('max_concurrency')}")
                print(level_table(r["levels"]))
                knee = s.get("knee")
                if knee:
                    print(f"knee at {knee['level']:g}")
                return 0
            if a.action == "export":
                if a.format == "json":
                    text = json.dumps(history.export_json(store, a.id), indent=1, default=str)
                elif a.what == "requests":
                    text = history.requests_csv(store, a.id)
                else:
                    text = history.levels_csv(store, a.id)
                _write_or_print(text, a.output)
                return 0
            if a.action == "delete":
                history.delete_run(store, a.id)
                print(f"deleted run {a.id}")
                return 0
    except history.RunNotFound as e:
        return _err(str(e))
    return _err(f"unknown action {a.action}")


# ---------------------------------------------------------------------- compare
def cmd_compare(a: argparse.Namespace) -> int:
    from app.compare import Pricing, compare_runs
    from app.history import RunNotFound
    from app.store import RunStore

    try:
        pricing = Pricing(gpu_hour=a.gpu_hour_price, kwh=a.kwh_price, currency=a.currency)
        with RunStore() as store:
            cmp = compare_runs(store, a.ids, pricing)
    except (RunNotFound, ValueError) as e:
        return _err(str(e))
    cur = pricing.currency
    print(f"baseline: {cmp.series[cmp.baseline].label} ({cmp.series[cmp.baseline].gpus} GPUs)")
    for sr in cmp.series:
        if not sr.levels:
            print(f"note: {sr.label} has no completed level (status {sr.status}): it has no rows below")
    head = (f"{'run':<28} {'GPUs':>4} {'level':>6} {'tok/s':>9} {'tok/s/GPU':>9} {'TTFT p99':>9} {'scaling':>8} "
            f"{'power W':>8} {'J/tok':>7} {cur + '/Mtok rent':>12} {cur + '/Mtok power':>13}")
    for title, rows in (("per level", cmp.rows), ("at each run's best level", cmp.peak_rows())):
        print(f"\n{title}:\n{head}\n" + "-" * len(head))
        for r in rows:
            print(f"{r.label[:28]:<28} {r.gpus:>4} {r.level:>6g} {r.output_tps:>9.1f} {r.tps_per_gpu:>9.1f} "
                  f"{_fmt(r.ttft_p99, 0, 1e3):>7}ms {_fmt(r.scaling_efficiency, 2):>8} {_fmt(r.power_w, 0):>8} "
                  f"{_fmt(r.j_per_token, 3):>7} {_fmt(r.cost_per_mtok_rented, 3):>12} "
                  f"{_fmt(r.cost_per_mtok_energy, 4):>13}")
    if a.csv:
        from app.profiles.io import write_atomic

        write_atomic(a.csv, cmp.to_csv())
        print(f"wrote {a.csv}", file=sys.stderr)
    if a.svg:
        from app.profiles.io import write_atomic

        write_atomic(a.svg, cmp.to_svg())
        print(f"wrote {a.svg}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- run
def cmd_run(a: argparse.Namespace) -> int:
    from app.profiles import ProfileLibrary, ProfileNotFound, read_profile
    from app.run.profile_run import Phase, ProfileRun

    try:
        p = read_profile(a.profile) if a.profile.endswith((".yaml", ".yml")) and Path(a.profile).is_file() \
            else ProfileLibrary().get(a.profile)
    except (ProfileError, ProfileNotFound) as e:
        return _err(str(e))
    over: dict = {}
    if a.levels:
        try:
            over["levels"] = [float(x) for x in a.levels.split(",") if x.strip()]
        except ValueError:
            return _err(f"--levels {a.levels!r}: write numbers separated by commas, e.g. 1,2,4,8")
    if a.step_seconds is not None:
        over["step_seconds"] = a.step_seconds
    if a.max_total_seconds is not None:
        over["max_total_seconds"] = a.max_total_seconds
    if over:
        try:
            p.ramp_spec("http://127.0.0.1:1", None, **over)
        except ValueError as e:
            return _err(f"ramp options: {e}")

    def on_phase(ph: Phase, msg: str) -> None:
        print(f"[{ph.value}]" + (f" {msg}" if msg else ""), flush=True)

    def on_level(st) -> None:
        print(f"  level {st.level:g}: {st.output_tps:.1f} out tok/s, TTFT p99 "
              f"{_fmt(st.ttft_p99, 0, 1e3)} ms, failures {st.failure_rate * 100:.1f}%", flush=True)

    def on_line(stream: str, text: str, t: float) -> None:
        if a.show_log:
            print(f"  | {text}", flush=True)

    s = ProfileRun(p, python=a.python, ramp_overrides=over, force=a.force, startup_timeout=a.startup_timeout,
                on_phase=on_phase, on_level=on_level, on_line=on_line)
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
        return _err("the session ended without a result (see the log above)")
    print()
    if res.steps:
        print(level_table([st.model_dump() for st in res.steps]))
    if res.knee:
        print(res.knee.describe())
    print(f"status: {res.status}" + (f" — {res.reason}" if res.reason else ""))
    if res.run_id is not None:
        print(f"recorded as run {res.run_id} (vllm-dyno runs show {res.run_id})")
    if a.save_results and res.run_id is not None and res.steps:
        from app.history import profile_from_run
        from app.store import RunStore

        with RunStore() as store:
            saved = profile_from_run(store, res.run_id, p.name)
        path = ProfileLibrary().save(saved)
        print(f"results saved with profile {saved.name!r} → {path}")
    if interrupted.is_set():
        return 130
    return 0 if res.ok else 1


# ---------------------------------------------------------------------- registration
def register(sub) -> None:
    p = sub.add_parser("profiles", help="tuning profiles: list, show, export, import, delete, save-run")
    ps = p.add_subparsers(dest="action", required=True)
    ps.add_parser("list", help="user and built-in profiles (bad files are reported, the rest still load)")
    x = ps.add_parser("show", help="print a profile as YAML")
    x.add_argument("name")
    x = ps.add_parser("export", help="a profile as a `vllm serve` command line, a vLLM --config YAML or a profile")
    x.add_argument("name")
    x.add_argument("--format", choices=["cmd", "yaml", "profile"], default="cmd")
    x.add_argument("--program", default="vllm serve", help="cmd: how vLLM is run (default %(default)r)")
    x.add_argument("-o", "--output", help="write to this file (atomically) instead of stdout")
    x = ps.add_parser("import", help="import a profile YAML, a vLLM --config YAML or a `vllm serve` command line")
    x.add_argument("file", help="file, '-' for stdin, or a quoted command line")
    x.add_argument("--name", help="profile name (default: the file's, or the model's)")
    x.add_argument("--force", action="store_true", help="replace a user profile of the same name")
    x = ps.add_parser("delete", help="delete a user profile (built-ins are read-only)")
    x.add_argument("name")
    x = ps.add_parser("save-run", help="save a recorded run's settings and results as a profile")
    x.add_argument("run_id", type=int)
    x.add_argument("--name", help="profile name (default: the run's)")
    x.add_argument("--which", choices=["latest", "best"], default="latest",
                   help="best: take the results of the best run recorded for the same profile")
    x.add_argument("--force", action="store_true", help="replace a user profile of the same name")
    p.set_defaults(func=cmd_profiles)

    r = sub.add_parser("runs", help="run history: list, show, export, delete")
    rs = r.add_subparsers(dest="action", required=True)
    rs.add_parser("list", help="recorded runs, newest first")
    x = rs.add_parser("show", help="a run's outcome and per-level table")
    x.add_argument("id", type=int)
    x = rs.add_parser("export", help="a run as JSON (everything) or CSV (levels or requests)")
    x.add_argument("id", type=int)
    x.add_argument("--format", choices=["json", "csv"], default="json")
    x.add_argument("--what", choices=["levels", "requests"], default="levels", help="csv: which table")
    x.add_argument("-o", "--output", help="write to this file instead of stdout")
    x = rs.add_parser("delete", help="delete a run and everything recorded with it")
    x.add_argument("id", type=int)
    r.set_defaults(func=cmd_runs)

    c = sub.add_parser("compare", help="compare two or more runs: scaling efficiency, J/token, cost per Mtok")
    c.add_argument("ids", type=int, nargs="+", metavar="ID")
    c.add_argument("--gpu-hour-price", type=float, help="price per GPU-hour (rented cards)")
    c.add_argument("--kwh-price", type=float, help="electricity price per kWh (owned cards; uses measured power)")
    c.add_argument("--currency", default="$")
    c.add_argument("--csv", help="write the per-level table as CSV here")
    c.add_argument("--svg", help="write both overlay charts as SVG here")
    c.set_defaults(func=cmd_compare)

    x = sub.add_parser("run", help="run a profile headless: plan, launch, ramp, record, stop, print the table")
    x.add_argument("profile", help="profile name (see `profiles list`) or a profile YAML file")
    x.add_argument("--python", help="interpreter with vLLM installed (engine vllm)")
    x.add_argument("--levels", help="override the ramp's levels, e.g. 1,2,4")
    x.add_argument("--step-seconds", type=float, help="override the seconds per level")
    x.add_argument("--max-total-seconds", type=float, help="cap the whole ramp")
    x.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the server")
    x.add_argument("--force", action="store_true", help="launch even when the planner says it cannot work")
    x.add_argument("--show-log", action="store_true", help="echo the server's log")
    x.add_argument("--save-results", action="store_true", help="save the results into the profile (user copy)")
    x.set_defaults(func=cmd_run)
