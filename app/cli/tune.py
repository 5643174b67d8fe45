"""``vllm-dyno tune``: the best vLLM flags for an SLO in a few launches (issue 18).

``vllm-dyno tune [PROFILE] --slo-ttft-p99 S --slo-tpot-p99 S [--objective users|throughput|cost|energy]
[--tp 2,4,8] [--dp 1,2] [--checkpoint awq=ID …] [--max-launches N] [--max-minutes M] [--json out.json]``;
against the sim: ``--engine sim --sim-gpu "RTX 4090" --sim-gpu-count 8 --model ID`` and
every ``serve`` option. A profile whose ``hosts:`` names two or more hosts is tuned over
them (issue 21): every launch goes through the hosts' agents (``--known-hosts``,
``--identity``, ``--ssh-config``), the head binds its address (``--expose`` required,
refused before any host is reached otherwise), the planner sees the rig's cards and
link, and layouts the rig's launch plan refuses are pruned. ``--dry-run`` prints the search space with the planner's
predictions and launches nothing; ``--resume ID`` continues an interrupted tune
(Ctrl-C saves it); ``--list`` and ``--show ID`` read the tunes in the run store.

Exit status: 0 with a recommendation, 1 when nothing met the SLO (or every launch
failed), 2 for bad input, 130 when interrupted (resumable).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

from app.cli.common import (
    BadInput,
    add_security_options,
    add_ssh_options,
    add_workload_options,
    workload_kw,
    add_sim_options,
    apply_api_key_file,
    config_from_args,
    err,
    executable,
    fraction,
    number_list,
    number_type,
    output_file,
    positive_int,
    positive_number,
    positive_seconds,
    profile_for_launch,
    rig_exposure_problem,
    sim_args_from,
    sim_rig_overrides,
    ssh_options,
    write_or_print,
)
from app.config import KV_CACHE_DTYPES, add_server_options, exposure_problem
from app.engines import TUNABLE, Engine


def _int_list(name: str):
    return number_list(int, what=f"{name} values", example="1,2,4")


def _kv_dtypes(text: str) -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in KV_CACHE_DTYPES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: give kv_cache_dtype values from {', '.join(KV_CACHE_DTYPES)}, "
                                         "e.g. auto,fp8")
    return vals


def _graphs(text: str) -> list[bool]:
    vals = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not vals or any(v not in ("on", "off") for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: write on, off or on,off")
    return [v == "off" for v in vals]  # enforce_eager


def _pair(text: str) -> tuple[str, str]:
    if "=" not in text or not text.split("=", 1)[0].strip() or not text.split("=", 1)[1].strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME=VALUE, e.g. awq=hugging-quants/…-AWQ-INT4")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


def _json_out(text: str) -> str:
    return text if text == "-" else output_file(text)


#: a search's resolution: a fraction strictly between 0 and 1
_resolution = number_type(float, low=0, high=1, low_open=True, high_open=True, what="a fraction", example="0.1")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="find the vLLM flags that serve the most users at your SLO, in a few launches",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("profile", nargs="?", help="profile name or YAML file (its engine, flags, rig and ramp shape)")
    p.add_argument("--engine", choices=[e.value for e in TUNABLE], help="default: the profile's, else vllm")
    add_server_options(p, model_required=False)
    add_sim_options(p)
    add_security_options(p)
    add_ssh_options(p)  # a profile with hosts: how they are reached (as `run`)
    p.add_argument("--python", type=executable, help="interpreter with vLLM installed (engine vllm)")
    p.add_argument("--trust-env", action="store_true", help="let the profile's env: set variables a shared profile "
                                                            "may not set unconfirmed (see `run --help`)")
    p.add_argument("--startup-timeout", type=positive_seconds, default=900.0, help="seconds to wait for each launch")
    p.add_argument("--grace", type=positive_seconds, help="seconds between SIGTERM and SIGKILL when a launch stops")
    w = p.add_argument_group("workload and SLO (default: the profile's ramp)")
    add_workload_options(w, "tune")  # the workload's kinds (over the profile's ramp): predicted and measured alike
    w.add_argument("--slo-ttft-p99", type=positive_seconds, help="TTFT p99 bound, s")
    w.add_argument("--slo-tpot-p99", type=positive_seconds, help="TPOT p99 bound, s per token")
    w.add_argument("--slo-e2e-p99", type=positive_seconds, help="end-to-end p99 bound, s")
    w.add_argument("--slo-failure-rate", type=fraction, help="failure-rate bound, a fraction (0.01 = 1 %%)")
    w.add_argument("--slo-ttfa-p99", type=positive_seconds, help="time to first answer token p99 bound, s")
    w.add_argument("--slo-rejection-rate", type=fraction,
                   help="bound on the requests the server refuses with HTTP 503 (admission control), a fraction")
    s = p.add_argument_group("search space (default: everything the planner lets start)")
    s.add_argument("--objective", choices=["users", "throughput", "cost", "energy"], default="users",
                   help="most users at the SLO (default), most tok/s there, lowest $/M tokens or J/token there")
    s.add_argument("--tp", type=_int_list("--tp"), help="tensor_parallel_size values, e.g. 2,4,8")
    s.add_argument("--pp", type=_int_list("--pp"), help="pipeline_parallel_size values")
    s.add_argument("--dp", type=_int_list("--dp"), help="data_parallel_size values")
    s.add_argument("--fewer-cards", action="store_true", help="also splits that leave cards idle")
    s.add_argument("--checkpoint", type=_pair, action="append", default=[], metavar="QUANT=MODEL",
                   help="a checkpoint of the model per quantization, e.g. awq=…-AWQ-INT4 (repeatable; default: "
                        "the profile's model)")
    s.add_argument("--mnbt", type=_int_list("--mnbt"), help="max_num_batched_tokens values (default: 2048, the "
                                                             "card's default and twice it)")
    s.add_argument("--kv-cache-dtypes", type=_kv_dtypes, help="kv_cache_dtype values (default auto,fp8 on GPUs)")
    s.add_argument("--cuda-graphs", type=_graphs, help="on, off or on,off (default both on GPUs)")
    s.add_argument("--vary", type=_pair, action="append", default=[], metavar="OPTION=V1,V2",
                   help="any other vLLM option and its values, e.g. block_size=16,32 (repeatable)")
    b = p.add_argument_group("budget and search")
    b.add_argument("--max-launches", type=positive_int, default=4, help="launches, the confirming one included "
                                                                         "(default 4)")
    b.add_argument("--offline", action="store_true",
                   help="with --engine sim: measure on the step-level engine under the sim's truth and perturbation "
                        "(no server, no HTTP: minutes instead of hours); seeded, deterministic")
    b.add_argument("--grid", action="store_true",
                   help="with --offline: measure every candidate of the space (the exhaustive grid) instead of "
                        "tuning; --json writes mode: grid with each candidate's true users")
    b.add_argument("--max-minutes", type=positive_number, help="stop launching after this many minutes (wall)")
    b.add_argument("--requests-per-level", type=positive_int, help="requests each search level is judged on "
                                                                    "(default 100: a p99)")
    b.add_argument("--resolution", type=_resolution, default=None,
                   help="search resolution, a fraction of the users (default 0.05, app.tuner.tune.TUNE_RESOLUTION: "
                        "finer than a lone search's 0.1, as candidates a few per cent apart are compared)")
    b.add_argument("--max-users", type=positive_int, default=1024,
                   help="the most users a search probes (default 1024; lower it for a small machine)")
    o = p.add_argument_group("output and state")
    o.add_argument("--json", type=_json_out, metavar="FILE", help="write the result as JSON here ('-' for stdout)")
    o.add_argument("--html", type=output_file, metavar="FILE",
                   help="write the result as one self-contained HTML report here (with --show ID: a stored tune's)")
    o.add_argument("--save-profile", metavar="NAME", help="save the recommended flags as a profile")
    o.add_argument("--export-command", action="store_true", help="print the recommendation as a `vllm serve` command")
    o.add_argument("--export-config", type=output_file, metavar="FILE", help="write the recommendation as a vLLM --config YAML")
    o.add_argument("--dry-run", action="store_true", help="print the space and the predictions; launch nothing")
    o.add_argument("--resume", type=positive_int, metavar="ID", help="continue an interrupted tune")
    o.add_argument("--list", action="store_true", help="list the tunes in the run store")
    o.add_argument("--show", type=positive_int, metavar="ID", help="print a tune's result")
    p.set_defaults(func=cmd_tune)


# ---------------------------------------------------------------------- building the spec
def spec_from_args(a: argparse.Namespace):
    # deferred: the tuner (planner, controller) only for this command
    from app.loadgen.spec import SLO
    from app.profiles.model import SimRig
    from app.tuner.report import build_spec, local_target, rig_target, scalar, sim_target

    prof = None
    hosts: list = []
    if a.profile:
        prof, cfg, _trusted, _builtin = profile_for_launch(a)
        cfg = prof.server_config()  # its env: screened
        hosts = list(prof.hosts) if len(prof.hosts) >= 2 else []
        unconfirmed = rig_exposure_problem(f"profile {prof.name!r}", hosts, a.expose)
        if unconfirmed:  # refused here, before any host is reached
            raise BadInput(unconfirmed)
    else:
        if not a.model:
            raise BadInput("give a PROFILE or --model (and --engine sim --sim-gpu … --sim-gpu-count … for the sim)")
        cfg = config_from_args(a)
        exposed = exposure_problem(cfg.host)
        if exposed and not a.expose:
            raise BadInput(exposed)
        apply_api_key_file(a)
    engine = Engine(a.engine) if a.engine else (prof.engine if prof is not None and prof.engine.spec.tunable
                                                else Engine.VLLM)
    ramp = prof.ramp if prof is not None else None
    sim_args: list[str] = []
    python = a.python
    if engine.simulated:
        rig = prof.sim if prof is not None and prof.sim is not None else None
        over = sim_rig_overrides(a)  # every rig option given (profile_for_launch applied them to a profile's)
        if rig is None and ("gpu" not in over or "count" not in over):
            raise BadInput("--engine sim needs the rig: --sim-gpu NAME --sim-gpu-count N")
        base = rig.model_dump() if rig else {}
        a.sim_rig = SimRig(**{**base, **over})  # the offline rig's seed and truth (--offline)
        sim_args, hardware, version = sim_target(a.sim_rig,
                                                 calibrated="--sim-calibrated" in sim_args_from(a), hosts=hosts or None)
    elif hosts:
        try:  # the hosts' cards, from their agents' hellos
            hardware, version = rig_target(hosts, ssh_options(a))
        except ValueError as e:
            raise BadInput(str(e)) from None
    else:
        try:
            python, hardware, version = local_target(a.python, cfg.gpus)
        except ValueError as e:
            raise BadInput(str(e)) from None
    slo = SLO(ttft_p99=a.slo_ttft_p99, tpot_p99=a.slo_tpot_p99, e2e_p99=a.slo_e2e_p99,
              failure_rate=a.slo_failure_rate, rejection_rate=a.slo_rejection_rate, ttfa_p99=a.slo_ttfa_p99)
    if slo.is_empty() and ramp is not None:
        slo = ramp.slo
    try:  # the profile ramp's workload (as a closed loop sends it), the options given over it
        base = ramp.closed_loop().model_dump() if ramp is not None else {}
        work = {**base, **workload_kw(a, "tune")}
    except ValueError as e:
        raise BadInput(str(e)) from None
    try:
        return build_spec(
            engine=engine, config=cfg, hardware=hardware, slo=slo,
            space=dict(tp=a.tp, pp=a.pp, dp=a.dp, checkpoints=dict(a.checkpoint), max_num_batched_tokens=a.mnbt,
                       kv_cache_dtype=a.kv_cache_dtypes, enforce_eager=a.cuda_graphs, fewer_cards=a.fewer_cards,
                       vary={k: [scalar(x) for x in v.split(",") if x.strip()] for k, v in a.vary}),
            sim_args=sim_args, python=python, vllm_version=version, objective=a.objective,
            max_launches=a.max_launches, max_minutes=a.max_minutes, requests_per_level=a.requests_per_level or 100,
            resolution=a.resolution, max_users=a.max_users, startup_timeout=a.startup_timeout, grace=a.grace,
            hosts=hosts, ray_address=prof.ray_address if prof is not None and hosts else None, **work)
    except ValueError as e:
        raise BadInput(str(e)) from None


# ---------------------------------------------------------------------- the command
def cmd_tune(a: argparse.Namespace) -> int:
    # deferred: the tuner and the store only for this command
    from app.settings import load_settings
    from app.store import RunStore
    from app.tuner.report import candidates_table
    from app.tuner.tune import TuneAborted, Tuner, TuneListener

    if a.list or a.show:
        with RunStore() as store:
            if a.list:
                rows = store.list_tunes()
                if not rows:
                    print("no tunes recorded yet")
                for r in rows:
                    print(f"{r['id']:4d}  {r['status']:11}  {r['name']}")
                return 0
            row = store.get_tune(a.show)
            if row is None:
                return err(f"--show {a.show}: no such tune (see `vllm-dyno tune --list`)")
            return _print_stored(row, a.html)
    try:
        store = RunStore()
    except Exception as e:
        return err(f"the run store cannot be opened: {e}")

    class Printer(TuneListener):
        def on_progress(self, state, message: str) -> None:
            print(f"[tune] {message}", flush=True)

    try:
        pricing = load_settings().pricing
    except Exception:
        pricing = None
    try:
        rig = dict(ssh=ssh_options(a), expose=a.expose)  # over a profile's hosts: how they are reached
        if a.resume:
            tuner = Tuner.resume(store, a.resume, listener=Printer(), pricing=pricing, **rig)
            s = tuner.spec
            unconfirmed = rig_exposure_problem(f"tune {a.resume}", s.hosts, a.expose)
            if unconfirmed:  # the tune relaunches on its hosts: the same confirmation, before any is reached
                tuner.ctl.close()
                store.close()
                return err(unconfirmed)
        else:
            spec = spec_from_args(a)
            measuring = _offline_rig(a, spec) if a.offline or a.grid else None
            if a.grid:
                store.close()
                return _grid(a, spec, measuring)
            tuner = Tuner(spec, store=store, listener=Printer(), pricing=pricing, rig=measuring, **rig)
    except BadInput as e:
        store.close()
        return int(e.code or 2)
    except ValueError as e:
        store.close()
        return err(str(e))
    if a.dry_run:
        try:
            res = tuner.dry_run()
        except ValueError as e:
            store.close()
            return err(str(e))
        print(candidates_table(res, limit=40))
        store.close()
        return 0

    box: dict = {}
    done = threading.Event()

    def body() -> None:
        try:
            box["state"] = tuner.run()
        except BaseException as e:  # reported below, on the main thread
            box["error"] = e
        finally:
            done.set()

    def on_sig(signum, _frame) -> None:
        if not box.get("stopping"):
            box["stopping"] = True
            print("\n[tune] stopping: the server is being stopped; the tune is saved", file=sys.stderr, flush=True)
            tuner.abort()

    old = {s: signal.signal(s, on_sig) for s in (signal.SIGINT, signal.SIGTERM)}
    th = threading.Thread(target=body, name="tune", daemon=True)
    th.start()
    try:
        while not done.wait(0.2):
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    try:
        e = box.get("error")
        if isinstance(e, TuneAborted):
            print(f"[tune] interrupted; resume with: vllm-dyno tune --resume {tuner.tune_id}", file=sys.stderr)
            return 130
        if isinstance(e, ValueError):
            return err(str(e))
        if e is not None:
            raise e
        res = tuner.result()
        return _report(a, res, tuner.spec)
    finally:
        store.close()


def _offline_rig(a: argparse.Namespace, spec: Any) -> Any:
    """``--offline``: the sim's rig (its ``--sim-perturb`` seed and truth) measured on the
    step-level engine (app.tuner.offline.OfflineRig), which the tuner only asks for measurements."""
    # deferred: only --offline needs them
    from app.profiles.truth import parse_truth
    from app.tuner.offline import OfflineRig

    if not a.offline:
        raise BadInput("--grid measures every candidate on the offline rig: add --offline (and --engine sim)")
    if not Engine(spec.engine).simulated:
        raise BadInput("--offline measures the simulated rig without a server: give --engine sim")
    if a.resume:
        raise BadInput("--offline: a tune measured offline is not resumed; run it again (it is deterministic)")
    sim = a.sim_rig
    return OfflineRig(spec, sim.perturb or 0, parse_truth(sim.truth) if sim.truth else None)


def _grid(a: argparse.Namespace, spec: Any, rig: Any) -> int:
    """``--grid --offline``: every candidate of the space measured on the offline rig, each
    the mean of enough searches that one user is ≤ 2 % of it
    (:meth:`app.tuner.offline.OfflineRig.true_capacity`): ``{"mode": "grid", "candidates":
    [{"key", "server", "true_users", "users_low", "users_high", "searches", "error"}],
    "cpu_seconds", "wall_seconds"}``, ``true_users`` null where the candidate cannot start."""
    # deferred: only --grid needs them
    from app.sim import model_adapter as ma
    from app.tuner.space import enumerate_candidates, server_flags

    cpu0, wall0 = time.process_time(), time.monotonic()
    cards = spec.hardware.planner_cards()
    cands = enumerate_candidates(spec.config, cards, spec.space, spec.workload(), spec.vllm_version,
                                 rig=spec.hardware.rig_layout())
    rows = []
    for c in cands:
        entry, error = None, c.pruned_because
        if error is None:
            try:
                entry = rig.true_capacity(c.config)
            except ma.Refusal as r:
                error = r.text
            if entry is None and error is None:
                error = "no memory left for the KV cache"
        rows.append({"key": c.key, "server": server_flags(c.config),
                     "true_users": round(entry.users, 3) if entry is not None else None,
                     "users_low": entry.users_low if entry is not None else None,
                     "users_high": entry.users_high if entry is not None else None,
                     "searches": entry.searches if entry is not None else 0, "error": error})
        print(f"[grid] {c.key}: " + (f"{entry.users:.2f} users (mean of {entry.searches}, "
                                     f"{entry.users_low:g}–{entry.users_high:g})" if entry is not None
                                     else f"— {error}"), flush=True)
    measured = [r for r in rows if r["true_users"] is not None]
    best = max(measured, key=lambda r: r["true_users"], default=None)
    cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    out = {"mode": "grid", "seed": spec.seed, "slo": spec.slo.model_dump(exclude_none=True),
           "best": best, "candidates": rows, "cpu_seconds": round(cpu_s, 1), "wall_seconds": round(wall_s, 1)}
    if best is not None:
        print(f"[grid] best of {len(measured)} startable of {len(rows)}: {best['key']} ({best['true_users']} users)")
    print(f"[grid] {len(rows)} candidates in {cpu_s:.0f} CPU s ({wall_s:.0f} s wall)")
    if a.json:
        # the timings vary run to run: the figures alone are the deterministic part
        write_or_print(json.dumps(out, indent=2, default=str), None if a.json == "-" else a.json)
    return 0 if best is not None else 1


def _report(a: argparse.Namespace, res: dict, spec: Any) -> int:
    # deferred: the tuner's report only for this command
    from app.tuner.report import candidates_table, export_config, save_as_profile, summary_text, vllm_serve_command

    print()
    print(candidates_table(res))
    print()
    print(summary_text(res))
    if a.json:
        write_or_print(json.dumps(res, indent=2, default=str), None if a.json == "-" else a.json)
    if a.html:
        _write_html(a.html, res)
    rec = res.get("recommendation")
    if rec is None:
        return 1
    if a.export_command:
        print(vllm_serve_command(rec["server"], spec.vllm_version))
    if a.export_config:
        export_config(a.export_config, rec["server"], spec.vllm_version)
        print(f"vLLM --config written to {a.export_config}")
    if a.save_profile:
        base = profile_for_launch(a)[0] if a.profile else None
        try:
            path = save_as_profile(res, spec, engine=spec.engine, sim=getattr(a, "sim_rig", None), base=base,
                                   name=a.save_profile)
        except (ValueError, OSError) as e:
            return err(f"--save-profile {a.save_profile!r}: {e}")
        print(f"saved as profile {a.save_profile!r}: {path}")
    return 0


def _write_html(path: str, res: dict, name: str = "") -> None:
    """The tune's HTML report (app.report.tune_report) with its flags as commands."""
    # deferred: only --html needs them
    from app.profiles.io import write_atomic
    from app.report import tune_report
    from app.tuner.report import vllm_serve_command

    commands = {}
    for key in ("recommendation", "runner_up", "baseline"):
        entry = res.get(key) or {}
        try:
            if entry.get("server"):
                commands[key] = vllm_serve_command(entry["server"])
        except Exception:  # a server mapping that is not a ServerConfig: the card has no command
            pass
    write_atomic(path, tune_report(res, commands, name))
    print(f"wrote {path}", file=sys.stderr)


def _print_stored(row: dict, html: str | None = None) -> int:
    # deferred: only --show needs the state model
    from app.tuner.report import candidates_table, summary_text
    from app.tuner.tune import TuneState

    state = TuneState.model_validate(row["state"] or {})
    res = {"tune_id": row["id"], "objective": (row["spec"] or {}).get("objective", "users"),
           "slo": {k: v for k, v in ((row["spec"] or {}).get("slo") or {}).items() if v is not None},
           "recommendation": state.recommendation, "runner_up": state.runner_up, "baseline": state.baseline,
           "launches": len(state.launches), "rig_seconds": state.rig_seconds, "wall_seconds": state.wall_seconds,
           "stop_reason": state.stop_reason or row["status"],
           "candidates": [{"key": r.key, "server": r.server, "predicted_users": r.predicted_users,
                           "measured_users": r.measured_users if r.measured else None,
                           "measured_low": r.measured_low, "measured_high": r.measured_high, "failed": r.failed,
                           "pruned_because": r.pruned_because} for r in state.candidates]}
    print(f"tune {row['id']} ({row['status']}): {row['name']}")
    print(candidates_table(res))
    print()
    print(summary_text(res))
    if html:
        _write_html(html, res, row["name"])
    return 0
