"""``vllm-dyno calibrate RUN_ID`` or ``--bench-result FILE``: fit the performance model
to a recorded real run, or to ``vllm bench serve`` result files.

The run's levels (closed-loop concurrency, rig seconds) and its request shape are read
from the run store; the model's parameters (η_mem, η_c, t_cpu, per-sequence and
per-request overheads — :data:`app.planner.calibrate.FIT_DEFAULT`) are fitted to its
output tokens/s and mean TTFT and saved under the run's hardware fingerprint
(``calibration/`` in the data directory). From then on the planner predicts with them
for those cards, and a sim started with ``--sim-calibrated`` on the same cards steps
with them.

``--bench-result FILE`` (repeatable) takes ``vllm bench serve --save-result`` files
instead, measured on the user's rig without vllm-dyno: each closed-loop run
(``--max-concurrency N``, ``--request-rate inf``) is one level of N users; the cards and
the ``vllm serve`` options are given as ``vllm-dyno predict`` takes them (``--model``,
``--gpu``, ``--count``, the server's options), and the fit is saved under those cards'
fingerprint (:func:`app.planner.benchserve.calibrate_on_results`). Exit status: 0 saved
(or shown with ``--dry-run``), 1 the fit could not be saved or vLLM would not serve the
configuration, 2 the run or file cannot be used (with the reason).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from app.cli.common import BadInput, cards_from_args, config_from_args, executable, input_file, positive_int, \
    run_number, vllm_version
from app.engines import Engine


class CalibrationInputError(ValueError):
    """A run that cannot calibrate the model; the message names the run and the fix."""


def measured_levels(run: dict[str, Any], levels: list[dict[str, Any]]):
    """(prompt_tokens, output_tokens, [MeasuredLevel]) of a recorded run. Raises
    CalibrationInputError for a sim or attached run, a rate ramp, request lengths that
    vary, or fewer than 2 completed levels."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.calibrate import MeasuredLevel

    rid = run["id"]
    engine = Engine.parse(run.get("engine"))
    if engine is not None and not engine.spec.calibrated:  # the sim's step times are its own defaults
        raise CalibrationInputError(f"run {rid} ran on the simulated rig: calibrate on a run of real cards "
                                    "(a sim run only gives back the sim's own parameters)")
    hw = (run.get("summary") or {}).get("hardware")
    if not hw:
        raise CalibrationInputError(f"run {rid} recorded no hardware fingerprint (an attached server?): "
                                    "calibrate on a run that vllm-dyno launched")
    spec = run.get("spec") or {}
    if spec.get("mode", "concurrency") != "concurrency":
        raise CalibrationInputError(f"run {rid} is a rate ramp: calibration needs closed-loop concurrency levels")
    pt, ot = spec.get("prompt_tokens"), spec.get("output_tokens")
    if not isinstance(pt, int) or not isinstance(ot, int) or spec.get("prompts_file"):
        raise CalibrationInputError(f"run {rid} did not use fixed prompt/output lengths (prompt {pt!r}, output "
                                    f"{ot!r}): ramp with --prompt-tokens N --output-tokens M to calibrate")
    out = [MeasuredLevel(int(lv["level"]), float(lv["output_tps"]), lv.get("ttft_mean"))
           for lv in levels if lv.get("output_tps") and (lv.get("n_ok") or 0) > 0]
    if len(out) < 2:
        raise CalibrationInputError(f"run {rid} has {len(out)} completed level(s): calibration needs at least 2 "
                                    "(ramp over several concurrency levels, e.g. 1,2,4,8)")
    return pt, ot, out


def calibrate_run(store, run_id: int, dry_run: bool = False):
    """Fit and (unless ``dry_run``) save. Returns ``(fingerprint, params, before, after,
    path)`` — ``before``/``after`` the per-level :class:`LevelError` lists with the
    default and the fitted parameters. Raises CalibrationInputError (see
    :func:`measured_levels`) and the planner's errors for an unknown model or card."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.calibrate import fit, hardware_fingerprint, level_errors, save_calibration
    from app.profiles.io import profile_from_data
    from app.profiles.model import HardwareFingerprint
    from app.run.profile_run import plan_profile

    run = store.get_run(run_id)
    if run is None:
        raise CalibrationInputError(f"no run {run_id} in {store.path} (vllm-dyno runs list shows the ids)")
    pt, ot, measured = measured_levels(run, store.levels(run_id))
    data = (run.get("config") or {}).get("profile")
    if not data:
        raise CalibrationInputError(f"run {run_id} recorded no settings (profile) to plan with")
    profile = profile_from_data(data, f"run {run_id}")
    hw = HardwareFingerprint.model_validate(run["summary"]["hardware"])
    profile = profile.model_copy(update={"hardware": hw, "engine": Engine.VLLM})
    plan = plan_profile(profile)
    if plan is None:
        raise CalibrationInputError(f"run {run_id}: the planner cannot plan its settings on {hw.gpu}")
    cap, _ = plan.concurrency_for(pt, ot)
    fitted = fit(plan.perf, measured, pt, ot, cap)
    before = level_errors(plan.perf, measured, pt, ot, cap)
    after = level_errors(plan.perf.with_params(fitted), measured, pt, ot, cap)
    fp = hardware_fingerprint(plan.cards, plan.rig)  # a rig's: its layout and link (the key plan() loads)
    path = None
    if not dry_run:
        path = save_calibration(fp, fitted, {"run_id": run_id, "prompt_tokens": pt, "output_tokens": ot,
                                             "capacity": cap, "levels": [e.__dict__ for e in after]})
    return fp, fitted, before, after, path


def calibrate_bench_results(a: argparse.Namespace):
    """Fit to ``a.bench_result``'s files on the cards and options of ``a`` and (unless
    ``--dry-run``) save: ``(fingerprint, params, before, after, path)`` as
    :func:`calibrate_run`. Raises CalibrationInputError for a file that cannot be used,
    app.planner.benchserve.NotServable for a configuration vLLM would refuse."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.benchserve import (BenchInputError, NotServable, bench_plan, calibrate_on_results,
                                        measured_level_of, read_result)
    from app.planner.calibrate import hardware_fingerprint, save_calibration  # deferred: as above
    from app.planner.versions import installed_version  # deferred: as above

    if not a.model:
        raise BadInput("--bench-result needs the server it measured: --model M (and --gpu, --count and its "
                       "vllm serve options, as vllm-dyno predict takes them)")
    try:
        results = [(f, read_result(f)) for f in a.bench_result]
        shapes = [measured_level_of(r, f)[1:] for f, r in results]
    except BenchInputError as e:
        raise CalibrationInputError(str(e)) from None
    cfg = config_from_args(a)
    cards = cards_from_args(a.gpu, a.count, cfg.world_size)
    try:
        p = bench_plan(cfg, cards, shapes, a.vllm_version or installed_version(a.python), use_calibration=False)
        cal = calibrate_on_results(p, results)
    except NotServable:
        raise
    except BenchInputError as e:
        raise CalibrationInputError(str(e)) from None
    fp = hardware_fingerprint(p.cards)
    path = None if a.dry_run else save_calibration(fp, cal.params, cal.info)
    return fp, cal.params, cal.before, cal.after, path


def cmd_calibrate(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.benchserve import NotServable
    from app.store import RunStore

    if (a.run_id is None) == (not a.bench_result):
        raise BadInput("give a run id (vllm-dyno runs list) or --bench-result FILE (vllm bench serve "
                       "--save-result), not both" if a.bench_result else
                       "give a run id (vllm-dyno runs list) or --bench-result FILE (vllm bench serve --save-result)")
    if a.run_id is not None and (a.model or a.gpu):
        raise BadInput("a run is calibrated on its own model and cards: drop --model/--gpu (they go with "
                       "--bench-result)")
    try:
        if a.bench_result:
            fp, params, before, after, path = calibrate_bench_results(a)
        else:
            with RunStore() as store:
                fp, params, before, after, path = calibrate_run(store, a.run_id, a.dry_run)
    except NotServable as e:
        print(f"vllm-dyno calibrate: {e}", file=sys.stderr)
        return 1
    except (CalibrationInputError, LookupError, ValueError) as e:
        print(f"vllm-dyno calibrate: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the calibration folder cannot be written (a read-only home, a full disk)
        print(f"vllm-dyno calibrate: cannot save the fit to {getattr(e, 'filename', None) or 'its file'}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{fp}: {params.source}")
    print(f"  η_mem {params.eta_mem:.3f}  η_c {params.eta_compute:.3f}  t_cpu {params.t_cpu_s * 1e3:.2f} ms/step  "
          f"{params.t_cpu_seq_s * 1e6:.0f} µs/sequence  {params.t_request_s * 1e3:.1f} ms/request")
    print(f"  {'level':>5} {'measured tok/s':>14} {'default':>9} {'calibrated':>10}")
    for b, c in zip(before, after):
        print(f"  {b.concurrency:>5} {b.measured_tps:>14,.0f} {b.tps_error_pct:>+8.1f}% {c.tps_error_pct:>+9.1f}%")
    print(f"saved to {path}" if path else "not saved (--dry-run)")
    return 0


def register(sub) -> None:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.config import add_server_options

    p = sub.add_parser("calibrate", help="fit the performance model to a recorded run or vllm bench serve results",
                       description="Fit the performance model (η_mem, η_c, CPU time per step and per "
                                   "request) to the levels of a recorded run of real cards — or to `vllm bench "
                                   "serve --save-result` files (--bench-result) with the server's --model, "
                                   "--gpu, --count and options —, show the error per level before and after, and "
                                   "save the fit for these cards: the planner, `vllm-dyno predict`, the predicted "
                                   "curves and `serve --engine sim --sim-calibrated` use it from then on.")
    p.add_argument("run_id", type=run_number, nargs="?", help="a run id (vllm-dyno runs list)")
    p.add_argument("--dry-run", action="store_true", help="show the fit, do not save it")
    p.add_argument("--bench-result", type=input_file, action="append", default=[], metavar="FILE",
                   help="a vllm bench serve --save-result file of a closed-loop run (--max-concurrency N, "
                        "--request-rate inf), repeatable (one per concurrency); instead of a run id")
    add_server_options(p, model_required=False)
    p.add_argument("--gpu", action="append", default=[], metavar="NAME[:GIB[:CC]]",
                   help="with --bench-result: the cards it ran on (as vllm-dyno predict --gpu; 'CPU' for the CPU "
                        "build)")
    p.add_argument("--count", type=positive_int, help="with --bench-result: number of cards of a single --gpu")
    p.add_argument("--vllm-version", type=vllm_version,
                   help="with --bench-result: the vLLM version it ran (default: the installed one)")
    p.add_argument("--python", type=executable, help="interpreter with vLLM (to read its version)")
    p.set_defaults(func=cmd_calibrate)
