"""The tuner against an exhaustive grid, on a rig whose true step times it does not know.

Issue 18, "Measured, not claimed": for 2 rigs (8× RTX 4090, 4× RTX 5090) × 2 models
(Llama-3.1-8B bf16, Llama-3.1-70B AWQ) × 2 workloads (chat 512/128 at TTFT p99 ≤ 2 s,
TPOT p99 ≤ 100 ms; long prompts 2048/256 at TTFT p99 ≤ 4 s, TPOT p99 ≤ 60 ms), each
case with its own hidden "true rig" (the sim's ``--sim-perturb SEED``: every step-time
term of the planner's defaults × a seeded factor in 0.6–1.6,
:func:`app.sim.perturb.true_params_of`):

- **grid**: every configuration of the tuner's own search space that the planner lets
  start (≥ 24 per case), its users at the SLO from the step-level engine under the true
  factors (the capacity search itself, run offline: the HTTP sim on 2 cores is too
  slow for a full grid) — as many launches as a grid tool (``vllm bench sweep``,
  ``auto_tune.sh``) would need, and its best;
- **spot-check**: the grid's top three measured over HTTP on the perturbed sim
  (``--spot-check``), to show the offline figures are the sim's;
- **tuner**: ``app.tuner`` with its default budget (4 launches), measuring over HTTP on
  the perturbed sim (default), or on the offline engine under the true factors
  (``--offline``: the same searches without HTTP, minutes instead of an hour).

Printed per case: the tuner's launches and rig minutes, the grid's launches (and the rig
minutes its searches would take), and the tuner's pick as a fraction of the grid's best
users at the SLO — the pick's true capacity (its grid entry) over the grid's best, with
both intervals. Goal (issue 18): ≥ 0.95 in ≤ 4 launches, every case.

Usage: ``.venv/bin/python benchmarks/tuner_vs_grid.py [--offline] [--cases 1,2] [--spot-check | --spot-only]``.

Figures (2-core development machine, ``--offline``, 2026-12-02, the tuner's searches at
5 % resolution, ``app.tuner.tune.TUNE_RESOLUTION``; the grid's best and the pick's true
capacity are means of 3 searches under the hidden true rig):

     # rig          model    workload       grid  grid rig min  tuner launches  tuner rig min  pick/best
     1 8× RTX 4090  8B bf16  chat 512/128     80        1204.2               4           13.9       0.99
     2 8× RTX 4090  8B bf16  long 2048/256    80        2104.1               3           25.9       1.00
     3 8× RTX 4090  70B AWQ  chat 512/128     72        2082.3               4           25.5       1.00
     4 8× RTX 4090  70B AWQ  long 2048/256    72        2087.0               4           57.4       1.00
     5 4× RTX 5090  8B bf16  chat 512/128     48         666.7               4           23.7       1.00
     6 4× RTX 5090  8B bf16  long 2048/256    48        1101.8               3           23.4       1.00
     7 4× RTX 5090  70B AWQ  chat 512/128     40         982.5               4           30.6       1.00
     8 4× RTX 5090  70B AWQ  long 2048/256    40        1270.6               4           72.0       1.00
    worst pick/best 0.99; cases ≥ 0.95: 8 of 8

Re-run offline on 2026-12-03 for the 70B cases 3, 4, 7 and 8 after pipeline-parallel
batches in flight entered the step-level engine and the tuner's analytic screen
(``StepTimeModel.decode_cycle``): 1.00 of the grid's best in each, in 4 launches (grid rig
minutes 2,067.0 / 2,074.3 / 992.9 / 1,267.7; tuner rig minutes 25.5 / 57.4 / 30.6 / 72.0).

The tuner's rig minutes are 1–6 % of the grid's. With the searches at a lone search's 10 %
(the run before, same day) case 3 picked 0.93 of the best: three candidates 8 % apart
(49, 50 and 53 users in truth) all measured about 50, as a 10 % bisection at 50 users stops
at a 5-user bracket; 7 of 8 cases met the goal. At 5 % the same case picks the best (the
truth's best itself moves by ±2 users between runs: its 3-search mean is noisy too).
Without the tie rule (a candidate predicted as good as the best measured, within its
spread, is measured while spare launches remain) the tuner stopped after 2 launches with
6 of 8 cases ≥ 0.95.

Over HTTP (the default; 2026-12-03, same machine, shared with other work): the 70B cases
(the 8B ones stream 7,800–11,700 output tok/s at their capacity, more than 2 cores serve
even at k = 1, so they run offline only):

     # rig          model    workload       grid  grid rig min  k     tuner launches  tuner rig min  pick/best
     3 8× RTX 4090  70B AWQ  chat 512/128     72        2082.3  3.5                4           28.0       1.00
     4 8× RTX 4090  70B AWQ  long 2048/256    72        2087.0  9.9                4           56.8       1.00
     7 4× RTX 5090  70B AWQ  chat 512/128     40         982.5  5.1                3           21.7       1.00
     8 4× RTX 5090  70B AWQ  long 2048/256    40        1270.6 10.0                4           73.6       0.94

Case 8's capacity is 6 users: its three measured candidates all measured 6; the pick was 5.7
in truth (5–6), the best 6.0 — judged on 3 searches, whose mean moves in steps of 1/3 user
(5.6 %, coarser than the goal's 5 %).

2026-12-03, later (the tie-break of equal measurements by
:func:`app.loadgen.capacity.crossing_users`; the truth from :func:`repeats_for` searches,
enough that one user is ≤ 2 % of it): case 8 over HTTP (k = 10, tuner wall 473 s) picks
5.78 of 5.78 true users, 1.00 (4 launches, 72.6 rig min); offline case 1 1.00 (960 of 960),
case 4 1.00 (11.2 of 11.2), case 8 1.00. The capacity level's headroom alone as the
tie-break had picked 10.6 of 11.2 on case 4 (0.95, under the goal). These figures predate
pipeline-parallel batches in flight in the engine (docs/perf-model.md), which changes the
PP candidates' predictions and true capacities.
``--spot-only`` (the grid's top three over HTTP, no tune), cases 3 and 7: offline 50.7, 48.7,
50.7 → HTTP 52, 52, 52; offline 32.7, 32.7, 31.3 → HTTP 33, 33, 32 users.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import ServerConfig  # noqa: E402
from app.loadgen.spec import SLO  # noqa: E402
from app.planner.gpus import lookup_gpu  # noqa: E402
from app.profiles.model import HardwareFingerprint  # noqa: E402
from app.sim import model_adapter as ma  # noqa: E402
from app.store import RunStore  # noqa: E402
from app.tuner.space import enumerate_candidates  # noqa: E402
from app.run.controller import RecordSpec, RunController  # noqa: E402
from app.tuner.offline import OfflineRig  # noqa: E402
from app.tuner.tune import ControllerRig, Tuner, TuneSpec  # noqa: E402

#: the sim's time scale over HTTP: at most MAX_K, and the rig's output tokens/s × k at
#: most WALL_TOKENS_PER_S (what the sim and the load generator stream on 2 cores,
#: tests/integration/test_plan_predict.py); below k = 1 a case runs offline only
MAX_K = 10.0
WALL_TOKENS_PER_S = 2000.0
#: searches averaged for the grid's top configurations and the tuner's pick
REPEATS = 3
#: ... and at least as many as make the mean's step (1 user ÷ repeats) at most this share
#: of the capacity: the goal's 5 % must be finer than the truth it is judged on (6 users
#: from 3 searches move in steps of 1/3 user, 5.6 %); at most MAX_REPEATS
TRUTH_STEP = 0.02
MAX_REPEATS = 20
#: grid configurations (by a single search) judged again on REPEATS searches
TOP_REPEATED = 8

RIGS = [("RTX 4090", 8), ("RTX 5090", 4)]
MODELS = [("meta-llama/Llama-3.1-8B-Instruct", None), ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "awq_marlin")]
WORKLOADS = [("chat 512/128", 512, 128, SLO(ttft_p99=2.0, tpot_p99=0.1)),
             ("long 2048/256", 2048, 256, SLO(ttft_p99=4.0, tpot_p99=0.06))]


def cases() -> list[tuple]:
    out = []
    n = 0
    for gpu, count in RIGS:
        for model, quant in MODELS:
            for wname, pt, ot, slo in WORKLOADS:
                n += 1
                out.append((n, gpu, count, model, quant, wname, pt, ot, slo, 100 + n))
    return out


def repeats_for(users: float) -> int:
    """Searches averaged for a true capacity of about ``users``: :data:`REPEATS`, or more
    where one user is a large share (:data:`TRUTH_STEP`), at most :data:`MAX_REPEATS`."""
    return int(min(MAX_REPEATS, max(REPEATS, math.ceil(1.0 / (TRUTH_STEP * max(users, 1.0))))))


def repeated(truth: OfflineRig, cfg: ServerConfig, users: float):
    """The true capacity (of about ``users``, a single search's) as the mean of
    :func:`repeats_for` searches (users_low/high: their range)."""
    ramp = truth.workload.search_spec()
    ramp = ramp.model_copy(update={"search": ramp.search.model_copy(update={"repeat": repeats_for(users)})})
    pred, _ = truth.search(cfg, ramp)
    cap = pred.capacity
    return cap.model_copy(update={"users_low": min(cap.repeat_users), "users_high": max(cap.repeat_users)})


def run_case(case: tuple, offline: bool, spot: bool, store: RunStore, tuner_too: bool = True) -> dict:
    n, gpu, count, model, quant, wname, pt, ot, slo, seed = case
    cfg = ServerConfig(model=model, served_model_name="m", quantization=quant, max_model_len=8192)

    def spec_at(k: float) -> TuneSpec:
        sim = ["--sim-gpu", gpu, "--sim-gpu-count", str(count), "--sim-time-scale", f"{k:g}", "--sim-seed", "1",
               "--sim-perturb", str(seed)]
        return TuneSpec(engine="sim", config=cfg, sim_args=sim, hardware=HardwareFingerprint(gpu=gpu, count=count),
                        vllm_version=ma.VLLM_RULES, prompt_tokens=pt, output_tokens=ot, slo=slo, grace=5)

    spec = spec_at(10)
    truth = OfflineRig(spec, seed)
    # the grid
    t0 = time.monotonic()
    cands = enumerate_candidates(cfg, [lookup_gpu(gpu)] * count, spec.space, spec.workload(), spec.vllm_version)
    by_key = {c.key: c for c in cands}
    grid = {}
    grid_rig = 0.0
    for c in cands:
        if c.pruned_because is None:
            pred, rig_s = truth.search(c.config)
            if pred is not None and pred.capacity is not None:
                grid[c.key] = pred.capacity
                grid_rig += rig_s
    grid_s = time.monotonic() - t0
    # a single search at a TTFT-bound SLO is noisy (a p99 of 100 requests is their tail:
    # whether two prefills collided); the top of the grid and the tuner's pick are judged
    # on the mean of REPEATS searches (CapacitySearch.repeat), each with fresh lengths
    top = sorted(grid, key=lambda k: -grid[k].users)[:TOP_REPEATED]
    for key in top:
        grid[key] = repeated(truth, by_key[key].config, grid[key].users)
    best_key = max(top, key=lambda k: grid[k].users)
    best = grid[best_key]
    # over HTTP the sim must stream the rig's tokens × k on 2 cores
    k = min(MAX_K, WALL_TOKENS_PER_S / max(1.0, best.output_tps or 1.0))
    http_ok = k >= 1.0
    spots = []
    if spot and http_ok:
        for key in top[:3]:
            ctl = RunController(store=store)
            ramp = spec.workload().search_spec()
            # started at the offline answer (a mean of searches: whole users for a concurrency search)
            start = float(max(1, round(grid[key].users)))
            ramp = ramp.model_copy(update={"search": ramp.search.model_copy(update={"start": start})})
            m = ControllerRig(spec_at(k), ctl).measure(by_key[key].config, ramp, RecordSpec(name=f"spot {key}"),
                                                       lambda: None)
            ctl.close()
            spots.append((key, grid[key], m.capacity, m.error))
    # the tuner
    t0 = time.monotonic()
    res = None
    if not tuner_too:
        return {"case": case, "spots": spots, "grid": grid, "spot_only": True}
    if offline or http_ok:
        tuner = Tuner(spec if offline else spec_at(k), store=store, rig=truth if offline else None)
        tuner.run()
        res = tuner.result()
    tune_s = time.monotonic() - t0
    if res is None:
        return {"case": case, "skipped": f"HTTP: the rig's {best.output_tps:.0f} tok/s at its capacity is more than "
                                         f"2 cores stream (k = {k:.2f} < 1): run with --offline", "grid": grid}
    res["k"] = k if not offline else None
    rec = res["recommendation"] or {}
    pick = rec.get("key")
    pick_true = None
    if pick in by_key:
        pick_true = grid[pick] if pick in top else repeated(truth, by_key[pick].config, best.users)
    return {"case": case, "spots": spots, "grid": grid, "grid_n": len(grid), "grid_rig_min": grid_rig / 60, "grid_s": grid_s, "best_key": best_key,
            "best": best, "pick": pick, "pick_true": pick_true, "tuner": res, "tune_s": tune_s,
            "pruned": sum(c.pruned_because is not None for c in cands), "all": len(cands)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--offline", action="store_true", help="the tuner measures on the offline engine (no HTTP)")
    ap.add_argument("--spot-check", action="store_true", help="measure the grid's top three over HTTP")
    ap.add_argument("--cases", help="comma list of case numbers (1–8)")
    ap.add_argument("--spot-only", action="store_true", help="with --spot-check: the grid and its spot-checks, no tune")
    a = ap.parse_args()
    chosen = cases()
    if a.cases:
        want = {int(x) for x in a.cases.split(",")}
        chosen = [c for c in chosen if c[0] in want]
    import tempfile

    store = RunStore(Path(tempfile.mkdtemp()) / "tune.sqlite")
    print(f"{'#':>2} {'rig':13} {'model':10} {'workload':14} {'grid':>5} {'grid rig min':>12} "
          f"{'tuner launches':>14} {'tuner rig min':>13} {'pick/best':>9}  best (interval) · pick true (interval)")
    fracs = []
    for case in chosen:
        r = run_case(case, a.offline, a.spot_check or a.spot_only, store, tuner_too=not a.spot_only)
        n, gpu, count, model, quant, wname = case[:6]
        if r.get("skipped"):
            print(f"{n:2d} {count}× {gpu:9} {wname:14}  {r['skipped']}")
            continue
        for key, off, http, err in r["spots"]:
            print(f"{n:2d}   spot-check {key}: offline {off.users:g} ({off.users_low:g}–{off.users_high:g}), over HTTP "
                  + (f"{http.users:g} ({http.users_low:g}–{http.users_high:g})" if http else f"failed: {err}"), flush=True)
        if r.get("spot_only"):
            continue
        t = r["tuner"]
        grid_of = r["grid"]
        best, pt = r["best"], r["pick_true"]
        frac = (pt.users / best.users) if pt is not None and best.users else 0.0
        fracs.append(frac)
        mshort = "70B AWQ" if quant else "8B bf16"
        print(f"{n:2d} {count}× {gpu:9} {mshort:10} {wname:14} {r['grid_n']:5d} {r['grid_rig_min']:12.1f} "
              f"{t['launches']:14d} {t['rig_seconds'] / 60:13.1f} {frac:9.2f}  "
              f"{best.users:g} ({best.users_low:g}–{best.users_high:g}) {r['best_key']} · "
              f"{pt.users if pt else '—'} ({pt.users_low if pt else '—'}–{pt.users_high if pt else '—'}) {r['pick']}")
        print(f"{'':5}stop: {t['stop_reason']}; tuner wall {r['tune_s']:.0f} s"
              f"{'' if t.get('k') is None else ' over HTTP at k = %.2f' % t['k']}, grid wall {r['grid_s']:.0f} s "
              f"(offline); pruned {r['pruned']} of {r['all']}")
        for c in t["candidates"]:
            if c["measured_users"] is not None or c["failed"]:
                g = grid_of.get(c["key"])
                print(f"{'':5}measured {c['key']}: first predicted {c['first_predicted_users']}, measured "
                      f"{c['measured_users']} ({c['measured_low']}–{c['measured_high']}), now predicted "
                      f"{c['predicted_users']}; grid {g.users if g else '—'}{' FAILED ' + c['failed'] if c['failed'] else ''}")
    if fracs:
        print(f"worst pick/best {min(fracs):.2f}; cases ≥ 0.95: {sum(f >= 0.95 for f in fracs)} of {len(fracs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
