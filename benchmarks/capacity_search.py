"""What a capacity answer costs: the capacity search against a fixed 1, 2, 4 … 256 ramp.

Issue 17: "rig-minutes and launches to a capacity answer vs a fixed 1,2,4,…,256 ramp at
the same per-level request floor, on the sim". For each case the run controller
launches the simulated rig once (a launch each way: both answers need one server) and
runs, on that server:

- **search**: ``RampSpec.search`` (doubling from 1, then bisecting to 10 % or 1 user),
  each level judged on ≥ 100 requests sent after every user finished one;
- **search@plan**: the same search started from the planner's predicted users at the
  SLO (``vllm-dyno ramp --find-capacity --start N``; the window starts there too);
- **fixed**: levels 1, 2, 4 … 256, each judged like a search level (100 requests sent
  after each user's first, ``settle``), every level run as a grid tool runs them
  (``vllm bench sweep``: the whole grid), and the same ramp stopped at its first level
  that breaks the SLO (``fixed→stop``); ``fixed, burst``: the latter with its users'
  first requests counted (the start-up burst: a plain fixed ramp's default).

Printed per case and way: launches, rig minutes (the levels' rig time, warm-up and
drain included), wall minutes on this machine, levels run, and the answer — the
search's users at SLO with its bootstrap interval, the fixed ramp's bracket (last
level that met the SLO … first that broke it). ``grid for 10 %`` is the number of fixed
levels a grid would need to answer to the search's resolution (a geometric grid of
ratio 1.1 from 1 to 256).

Usage: ``.venv/bin/python benchmarks/capacity_search.py [--cases demo,qwen7b]``.
Rig seconds are the sim's own clock (time scale k: wall × k); nothing is asserted.

Figures of one run (2-core development machine, 2026-12-02, sim seed 1, ±25 % lengths,
512/128; demo = 8× RTX 4090 Llama-3.1-70B AWQ at TTFT p99 ≤ 2 s, TPOT p99 ≤ 100 ms;
qwen7b = 2× RTX 4090 Qwen2.5-7B):

    case    way           launches  rig min  wall min  levels  answer
    demo    search               1    21.07      4.24      10  19 users (19–23)   0.84× grid rig time
    demo    search@plan          1     8.54      1.74       6  19 users (0–22)    0.34×
    demo    fixed (grid)         1    25.22      5.07       9  bracket 16…32      1.00×
    demo    fixed→stop           1    15.52      3.13       6  bracket 16…32      0.62×
    demo    fixed, burst         1    12.18      2.47       4  bracket 4…8        0.48×
    qwen7b  search               1     8.78      4.42       8  15 users (15–16)   0.91×
    qwen7b  search@plan          1     2.11      1.08       5  15 users (0–17)    0.22×
    qwen7b  fixed (grid)         1     9.68      4.87       9  bracket 8…16       1.00×
    qwen7b  fixed→stop           1     7.36      3.71       5  bracket 8…16       0.76×
    qwen7b  fixed, burst         1     6.69      3.37       4  bracket 4…8        0.69×

The search answers to 10 % (or a user) for 0.84–0.91× the rig time of the fixed grid,
which only brackets the answer within a factor of 2 (a geometric grid to 10 % would need
60 levels); from the plan's prediction it takes 0.22–0.34×. Counting the start-up burst
(a plain fixed ramp's default) puts the bracket at 4…8: the burst of first requests
queues their prefills. A search started at the prediction whose one met level is not met
in ≥ 95 % of the bootstrap resamples reports its low end as 0 (no level below was probed).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import ServerConfig  # noqa: E402
from app.loadgen.capacity import level_met  # noqa: E402
from app.loadgen.spec import SLO, CapacitySearch, RampSpec  # noqa: E402
from app.planner.gpus import lookup_gpu  # noqa: E402
from app.planner.models import resolve_model  # noqa: E402
from app.planner.plan import Workload, plan  # noqa: E402
from app.profiles.io import read_profile  # noqa: E402
from app.run.controller import RunController  # noqa: E402
from app.run.target import launch_target  # noqa: E402
from app.sim import model_adapter as ma  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXED = [1, 2, 4, 8, 16, 32, 64, 128, 256]
FLOOR = 100  # requests per level, both ways


def _demo() -> ServerConfig:
    return read_profile(ROOT / "profiles" / "sim-demo-8x-rtx-4090-llama-3-70b-awq.yaml").server_config()


#: name → (server config, card, count, SLO, time scale k). k keeps the rig's token rate
#: × k within what the sim and the load generator stream on 2 cores at 256 users.
CASES = {
    "demo": (_demo, "RTX 4090", 8, SLO(ttft_p99=2.0, tpot_p99=0.1), 5.0),
    "qwen7b": (lambda: ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=2, max_num_seqs=256,
                                    max_model_len=4096), "RTX 4090", 2, SLO(ttft_p99=0.4, tpot_p99=0.025), 2.0),
}


def rig_seconds(steps) -> float:
    return sum(s.t_end - s.t_start for s in steps)


def bracket(steps, slo: SLO) -> str:
    met = [s.level for s in steps if level_met(s, slo)]
    broke = [s.level for s in steps if not level_met(s, slo)]
    lo = max((m for m in met if not broke or m < min(broke)), default=None)
    hi = min(broke) if broke else None
    return f"{lo if lo is not None else '<1'}…{hi if hi is not None else '>256'}"


def predicted_users(cfg: ServerConfig, gpu: str, count: int, slo: SLO) -> float:
    """The planner's predicted users at ``slo`` for the sim's rig (the sim's vLLM rules,
    default step-time parameters): where ``search@plan`` starts."""
    p = plan(cfg, [lookup_gpu(gpu)] * count, resolve_model(cfg.model), Workload.of(512, 128, (1,), slo=slo),
             vllm_version=ma.VLLM_RULES, use_calibration=False)
    users = p.predicted_users_at_slo
    if not users:
        raise SystemExit(f"the planner predicts no users at {slo} for {cfg.model}")
    return float(users)


def run_case(name: str) -> list[tuple]:
    cfg_of, gpu, count, slo, k = CASES[name]
    cfg = cfg_of()
    rig = ["--sim-gpu", gpu, "--sim-gpu-count", str(count), "--sim-time-scale", repr(k), "--sim-seed", "1"]
    base = dict(url="http://127.0.0.1:1", prompt_tokens=512, output_tokens=128, slo=slo,
                requests_per_level=FLOOR, step_seconds=600.0)
    predicted = predicted_users(cfg, gpu, count, slo)
    ways = {
        "search": RampSpec(**base, search=CapacitySearch()),
        "search@plan": RampSpec(**base, search=CapacitySearch(start=predicted)),
        "fixed (grid)": RampSpec(**{**base, "slo": SLO()}, levels=FIXED, settle=True),  # judged afterwards
        "fixed→stop": RampSpec(**base, levels=FIXED, settle=True),
        "fixed, burst": RampSpec(**base, levels=FIXED),
    }
    rows = []
    for way, spec in ways.items():
        ctl = RunController()
        try:
            t0 = time.monotonic()
            errs = ctl.launch(launch_target("sim", cfg, sim_args=rig, telemetry=False))
            if errs:
                raise SystemExit(f"{name}: launch refused: {errs}")
            if not ctl.wait_ready(120):
                raise SystemExit(f"{name}: {ctl.failure_text}")
            t1 = time.monotonic()
            out = ctl.ramp(spec.model_copy(update={"url": ctl.url}))
            wall = time.monotonic() - t1
        finally:
            ctl.stop()
            ctl.close()
        if not out.ok:
            raise SystemExit(f"{name} {way}: {out.status}: {out.stop_reason or out.error}")
        if way.startswith("search") and out.capacity is not None:
            c = out.capacity
            answer = f"{c.users:g} users ({c.users_low:g}–{c.users_high:g})"
        else:
            answer = "bracket " + bracket(out.steps, slo)
        rows.append((name, way, 1, rig_seconds(out.steps) / 60, wall / 60, (t1 - t0), len(out.steps),
                     " ".join(f"{s.level:g}{'' if level_met(s, slo) else '✗'}" for s in out.steps), answer))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    a = ap.parse_args()
    grid10 = math.ceil(math.log(256) / math.log(1.1)) + 1
    print(f"per-level floor {FLOOR} requests; a geometric grid to 10 % from 1 to 256 needs {grid10} levels")
    print(f"{'case':8} {'way':13} {'launches':>8} {'rig min':>8} {'wall min':>8} {'levels':>6}  answer / levels run")
    for name in a.cases.split(","):
        rows = run_case(name.strip())
        base = rows[2][3]
        for case, way, launches, rig_min, wall_min, _ready_s, n, levels, answer in rows:
            print(f"{case:8} {way:13} {launches:8d} {rig_min:8.2f} {wall_min:8.2f} {n:6d}  {answer}"
                  f"  [{rig_min / base:.2f}× grid rig time]")
            print(f"{'':32}levels: {levels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
