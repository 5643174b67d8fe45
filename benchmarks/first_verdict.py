"""Launch → the first trustworthy verdict on the demo (issue 37, item 2): wall and rig time.

The demo profile (sim, 8× RTX 4090, Llama-3.1-70B AWQ, TTFT p99 ≤ 2 s, TPOT p99 ≤ 100 ms,
512/128 tokens ±25 %) is launched once per way through the run controller, as the window
launches it, and each way's ramp runs on it:

- **search**: the capacity search from 1 user (doubling, then bisecting), each level
  judged on ≥ 100 requests sent after every user finished one (the window's old "Find
  capacity");
- **search@plan**: the same search from the planner's predicted users at the SLO;
- **Run ramp**: what the window's Run ramp sends with its defaults — with the code this
  script runs against. Before issue 37 a fixed ramp 1, 2, 4 … 128 of 20-s levels stopped
  at its first broken level (its p99 from a level's start-up burst); since, the capacity
  search from the plan bracketed by 25 % (``CapacitySearch.from_prediction``), stopping at
  the resolution in whole users and each level once its verdict is decided
  (app.loadgen.capacity.level_decided).

Printed per way: the sim's launch-to-ready wall seconds, the ramp's rig minutes (the
levels' rig time, settle and drain included: the cards' time) and wall minutes, Launch →
verdict wall minutes, the levels run (✗ broken, ``d`` decided early) and the answer.

Run it against another checkout's code to compare (before → after)::

    PYTHONPATH=/path/to/old/checkout .venv/bin/python benchmarks/first_verdict.py
    PYTHONPATH=$PWD .venv/bin/python benchmarks/first_verdict.py

``--time-scale K`` (default: the demo profile's ``sim.time_scale``, else 1) sets the
sim's speed: rig minutes do not depend on it, wall minutes are rig ÷ K plus the
overheads. Rig seconds are the sim's own clock; nothing is asserted.

Figures of one run each (2-core machine shared with other work, 2026-12-07, sim ×4; the
plan predicts 22 users; ``✗`` broken, ``d`` decided early, ``/n`` requests judged)::

    before (5074189)  ready s  rig min  wall min  launch→verdict  answer
    Run ramp            13.8     3.96      1.08     1.31 (≈4.2 at ×1)  128 users — fixed 20-s levels;
                                                    64 and 128 finished no request and counted as met
    search@plan         11.5     6.73      1.77     1.96   22 (22–24)  [22 44✗ 33✗ 27✗ 24✗, 100 each]
    search               8.2    17.85      4.51     4.65   20 (20–22)  [1 2 4 8 16 32✗ 24✗ 20 22✗]

    after
    Run ramp            10.5     2.66      0.73     0.91   22 (22–24)  [22/100 27✗d/31 24✗d/27]
    search@plan         11.5     4.70      1.27     1.46   22 (22–24)  [22/100 44✗d/45 33✗d/34 27✗d/29 24✗d/46]
    search              11.0     9.58      2.49     2.67   20 (20–22)  [1d/40 2d/41 4d/43 8d/47 16d/55
                                                                        32✗d/33 24✗d/26 20/100 22✗d/71]

Before, the window's default was the fixed ramp (its trustworthy answer, Find capacity =
``search``, took 17.9 rig minutes, wall = rig at ×1); after, Run ramp is the search from
the plan: 2.66 rig minutes, 0.91 wall minutes from Launch at the demo's ×4.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: the checkout measured

from app.loadgen.capacity import level_met  # noqa: E402
from app.loadgen.spec import CapacitySearch, RampSpec  # noqa: E402
from app.planner.gpus import lookup_gpu  # noqa: E402
from app.planner.models import resolve_model  # noqa: E402
from app.planner.plan import Workload, plan  # noqa: E402
from app.profiles.io import read_profile  # noqa: E402
from app.run.controller import RunController  # noqa: E402
from app.run.target import launch_target  # noqa: E402
from app.sim import model_adapter as ma  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "profiles" / "sim-demo-8x-rtx-4090-llama-3-70b-awq.yaml"


def predicted_users(prof, ramp: RampSpec) -> float:
    """The plan's predicted users at the demo's SLO (the Plan banner's figure)."""
    cfg = prof.server_config()
    p = plan(cfg, [lookup_gpu(prof.sim.gpu)] * prof.sim.count, resolve_model(cfg.model), Workload.from_ramp(ramp),
             vllm_version=ma.VLLM_RULES, use_calibration=False)
    return float(p.predicted_users_at_slo or 1)


def window_run_ramp(base: dict, predicted: float, max_level: int) -> RampSpec:
    """The window's Run ramp with its defaults, as the checkout being measured builds it."""
    if hasattr(CapacitySearch, "from_prediction"):  # issue 37: the search from the plan
        return RampSpec(**base, search=CapacitySearch.from_prediction(predicted, max_level=max_level),
                        requests_per_level=100, step_seconds=600.0)
    return RampSpec(**{**base, "warmup_seconds": 2.0}, max_level=max_level, step_seconds=20.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ways", default="Run ramp,search@plan,search", help="comma list of the ways to run")
    ap.add_argument("--time-scale", type=float, default=None, help="sim speed k (default: the profile's, else 1)")
    a = ap.parse_args()
    prof = read_profile(DEMO)
    k = a.time_scale or getattr(prof.sim, "time_scale", None) or 1.0
    r = prof.ramp
    base = dict(url="http://127.0.0.1:1", prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, slo=r.slo)
    max_level = int(r.max_level or 128)
    predicted = predicted_users(prof, RampSpec(**base, search=CapacitySearch(), requests_per_level=100))
    ways = {"Run ramp": window_run_ramp(base, predicted, max_level),
            "search@plan": RampSpec(**base, search=CapacitySearch(start=predicted, max_level=max_level),
                                    requests_per_level=100, step_seconds=600.0),
            "search": RampSpec(**base, search=CapacitySearch(max_level=max_level), requests_per_level=100,
                               step_seconds=600.0)}
    rig = prof.sim.model_copy(update={"time_scale": k}).argv()
    print(f"demo: {prof.sim.count}× {prof.sim.gpu}, plan predicts {predicted:g} users; sim time scale {k:g}")
    print(f"{'way':12} {'ready s':>7} {'rig min':>7} {'wall min':>8} {'launch→verdict':>14}  answer  [levels]")
    for way in [w.strip() for w in a.ways.split(",")]:
        spec = ways[way]
        ctl = RunController()
        try:
            t0 = time.monotonic()
            errs = ctl.launch(launch_target("sim", prof.server_config(), sim_args=rig, telemetry=False))
            if errs:
                raise SystemExit(f"launch refused: {errs}")
            if not ctl.wait_ready(180):
                raise SystemExit(ctl.failure_text)
            t1 = time.monotonic()
            out = ctl.ramp(spec.model_copy(update={"url": ctl.url}))
            t2 = time.monotonic()
        finally:
            ctl.stop()
            ctl.close()
        if not out.ok:
            raise SystemExit(f"{way}: {out.status}: {out.stop_reason or out.error}")
        rig_min = sum(s.t_end - s.t_start for s in out.steps) / 60
        c = out.capacity
        if c is not None:
            answer = f"{c.users:g} users ({c.users_low:g}–{c.users_high:g})"
        else:
            met = [s.level for s in out.steps if level_met(s, spec.slo)]
            answer = f"{max(met, default=0):g} users (fixed ramp, p99 from {out.steps[0].n_ok}… requests)"
        levels = " ".join(f"{s.level:g}{'' if level_met(s, spec.slo) else '✗'}{'d' if s.stop_reason == 'decided' else ''}"
                          f"/{s.n_ok}" for s in out.steps)
        print(f"{way:12} {t1 - t0:7.1f} {rig_min:7.2f} {(t2 - t1) / 60:8.2f} {(t2 - t0) / 60:14.2f}  {answer}  "
              f"[{levels}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
