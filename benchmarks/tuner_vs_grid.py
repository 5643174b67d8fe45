"""The tuner against an exhaustive grid, on rigs whose true step times it does not know.

Issue 18, "Measured, not claimed", and issue 35, "a benchmark that can fail": for 2 rigs
(8× RTX 4090, 4× RTX 5090) × 2 models (Llama-3.1-8B bf16, Llama-3.1-70B AWQ) × 2 workloads
(chat 512/128 at TTFT p99 ≤ 2 s, TPOT p99 ≤ 100 ms; long prompts 2048/256 at TTFT p99 ≤
4 s, TPOT p99 ≤ 60 ms) — the cases — and for each case every *truth*:

- ``perturb``: the case's own hidden "true rig" in the model's class (the sim's
  ``--sim-perturb SEED``: every step-time term of the planner's defaults × a seeded factor
  in 0.6–1.6, :func:`app.sim.perturb.true_params_of`) — exactly the factors the tuner fits;
- every configuration-dependent truth file (``--sim-truth``, app/profiles/truth.py): the
  shipped examples (resources/truths/: all-reduce over PCIe from TP 4, AWQ at large
  batches, data parallel replicas sharing a host, pipeline bubbles, superlinear prefill
  chunks) and those written to break the tuner (benchmarks/data/truths/: all five at
  once, data parallel costly with a cheap all-reduce, an FP8 KV cache that costs more than
  it saves, CUDA graphs that cost and eager mode that does not);

the benchmark computes:

- **grid**: every configuration of the tuner's own search space that the planner lets
  start (≥ 24 per case), its users at the SLO from the step-level engine under the truth
  (the capacity search itself, offline: the HTTP sim on 2 cores is too slow for a grid) —
  as many launches as a grid tool (``vllm bench sweep``, ``auto_tune.sh``) would need;
  one search each, then the top :data:`TOP_REPEATED` (and the baselines' and the pick's
  configurations) as the mean of enough searches that one user is ≤ 2 % of the figure
  (:meth:`app.tuner.offline.OfflineRig.true_capacity`); the best of those is the grid's best;
- **tuner**: ``app.tuner`` with its default budget (4 launches, the confirming one
  included) measuring on the offline engine under the truth (``--offline``) or over HTTP
  on the sim served with it (default; only where 2 cores can stream the rig's tokens);
- **defaults**: vLLM's defaults with the largest tensor-parallel size that fits
  (:func:`defaults_candidate`), its true users;
- **random-4**: the exact expected best of 4 configurations drawn at random from the
  startable grid (:func:`random_best_expectation`, over every draw, not one).

Printed per case × truth: the grid's size and rig minutes, the tuner's launches and rig
minutes, the pick's true users ÷ the grid's best, the defaults' and random-4's ÷ the
grid's best, and ok: the goal (issue 35) — pick ≥ 0.95 of the best in ≤ 4 launches and
never below the random-4 expectation. Grids are cached in ``build/tuner-grid-cache``
(keyed by the case, the truth's text and the engine's source; ``--no-cache`` computes
them again).

Usage: ``.venv/bin/python benchmarks/tuner_vs_grid.py [--offline] [--cases 1,2] [--truths perturb,all-five]
[--spot-check | --spot-only] [--verbose]``.

Figures (issue 35, 2026-12-07, ``--offline``, 2-core machine shared with other work; the
70B AWQ chat cases only — each grid is 35–93 CPU s and the tune 1–5 min there, so the 8B
and long-prompt cases and several truths were not run; the same cached grids before and
after). Before: the tuner of main (commit 4c9243e); after: this branch's (families first,
per-family correction, the residual between families as the uncertainty, stop on
evidence). Columns: launches, rig min, pick/best; defaults and random-4 ÷ the best:

     #  truth                before              after               defaults  random-4
     3  perturb              3  20.8  1.00 ✓    4  26.5  0.96 ✓      0.50      0.74
     3  awq-large-batch      3  19.8  1.00 ✓    4  25.7  1.00 ✓      0.47      0.70
     3  layout-inverted      3  21.0  1.00 ✓    4  28.6  0.97 ✓      0.78      0.82
     3  graphs-no-gain       4  26.4  1.00 ✓    4  27.2  1.00 ✓      0.46      0.68
     3  fp8-kv-slow          3  20.1  0.92 ✗    4  27.3  0.92 ✗      0.48      0.64
     7  perturb              3  20.9  1.00 ✓    4  29.4  0.93 ✗      0.68      0.81
     7  graphs-no-gain       4  29.0  1.00 ✓    4  27.6  1.00 ✓      0.74      0.87
     7  fp8-kv-slow          3  23.6  0.72 ✗    4  30.9  0.92 ✗      0.71      0.75

Before only (not rerun after): case 7 awq-large-batch, dp-shared-host, pcie-4090-allreduce
1.00 in 2 launches; layout-inverted 1.00 in 4; all-five 1.00 in 3. Every "after" row is
the final rule (commit 00ffb2e); case 7 perturb fell from 1.00 to 0.93 with it (the
launches went to untried families instead of the best family's siblings). The
truths written to break the tuner mostly did not move the best away from the model's
favourite layout (TP2 × DP4 on 8× 4090, TP2 × DP2 on 4× 5090); the FP8 KV cache one did,
and broke the tuner of main (0.72, below random's 0.75: every launch a variant of one
FP8 family). After: 0.92 on both — each time the best is the pick's sibling with another
max_num_batched_tokens (42.0 vs 38.5 users, kv auto mnbt 2048 vs 4096; 38.0 vs 35.0),
which the rule leaves for refinement once untried families can still win. Goal not met
on that truth; never below random-4 after. An intermediate rule (untried families ranked
by their bound, not their corrected prediction) gave 0.79 and 0.93 on case 3's FP8 and
layout-inverted truths: the bound favoured candidates differing in more families.

The 72-startable (80-candidate) grid of case 3 under pcie-4090-allreduce through the CLI
(``tune --grid --offline``, every figure the mean of enough searches that one user ≤ 2 %
of it): 236 CPU s (≤ 5 min on one core; 1,376 s wall beside other work); 345 CPU s before
the first search counted and the mean of five decided the rest.

History (issue 18, the perturbed rig only):

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
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import ServerConfig  # noqa: E402
from app.loadgen.spec import SLO  # noqa: E402
from app.planner.gpus import lookup_gpu  # noqa: E402
from app.planner.versions import rules_for  # noqa: E402
from app.profiles.model import HardwareFingerprint  # noqa: E402
from app.profiles.truth import load_truth  # noqa: E402
from app.sim import model_adapter as ma  # noqa: E402
from app.store import RunStore  # noqa: E402
from app.tuner.space import Candidate, enumerate_candidates  # noqa: E402
from app.run.controller import RecordSpec, RunController  # noqa: E402
from app.tuner.offline import GridEntry, OfflineRig  # noqa: E402
from app.tuner.tune import ControllerRig, Tuner, TuneSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: the sim's time scale over HTTP: at most MAX_K, and the rig's output tokens/s × k at
#: most WALL_TOKENS_PER_S (what the sim and the load generator stream on 2 cores,
#: tests/integration/test_plan_predict.py); below k = 1 a case runs offline only
MAX_K = 10.0
WALL_TOKENS_PER_S = 2000.0
#: grid configurations (by a single search) judged again as the mean of enough searches
#: (OfflineRig.true_capacity: one user ≤ 2 % of the figure), with the defaults baseline
#: and the tuner's pick; the others' single search enters the random-4 expectation
TOP_REPEATED = 8
#: launches of the random baseline (the tuner's default budget)
RANDOM_DRAWS = 4

RIGS = [("RTX 4090", 8), ("RTX 5090", 4)]
MODELS = [("meta-llama/Llama-3.1-8B-Instruct", None), ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "awq_marlin")]
WORKLOADS = [("chat 512/128", 512, 128, SLO(ttft_p99=2.0, tpot_p99=0.1)),
             ("long 2048/256", 2048, 256, SLO(ttft_p99=4.0, tpot_p99=0.06))]
#: the configuration-dependent truths: the shipped examples and those written to break the tuner
TRUTH_FILES = sorted((ROOT / "resources/truths").glob("*.yaml")) + sorted(
    (ROOT / "benchmarks/data/truths").glob("*.yaml"))
#: where grids are kept between runs (they do not depend on the tuner): keyed by the case,
#: the truth's text and the engine's source, so a change to either is a new grid
CACHE = ROOT / "build/tuner-grid-cache"
ENGINE_SOURCES = ("app/engine", "app/planner/predict.py", "app/planner/plan.py", "app/sim/perturb.py",
                  "app/profiles/truth.py", "app/tuner/offline.py", "app/tuner/space.py", "app/loadgen/capacity.py")


def cases() -> list[tuple]:
    out = []
    n = 0
    for gpu, count in RIGS:
        for model, quant in MODELS:
            for wname, pt, ot, slo in WORKLOADS:
                n += 1
                out.append((n, gpu, count, model, quant, wname, pt, ot, slo, 100 + n))
    return out


def truths() -> list[tuple[str, Path | None]]:
    """(label, file): ``perturb`` (the case's own --sim-perturb seed, in the model's class)
    then every truth file (on the planner's defaults, seed 0)."""
    return [("perturb", None)] + [(f.stem, f) for f in TRUTH_FILES]


def random_best_expectation(values: list[float], draws: int = RANDOM_DRAWS) -> float:
    """The exact expectation of the best of ``draws`` configurations drawn without
    replacement, all draws equally likely, from ``values`` (users at the SLO, 0 where a
    configuration serves none): with the values sorted ascending, the i-th (1-based) is the
    best of a draw with probability C(i−1, draws−1) / C(n, draws). Fewer values than
    draws: the best of them all."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return 0.0
    if n <= draws:
        return v[-1]
    total = math.comb(n, draws)
    return sum(x * math.comb(i, draws - 1) for i, x in enumerate(v)) / total


def defaults_candidate(cands: list[Candidate], gpu: str, version: str | None) -> Candidate | None:
    """vLLM's defaults with the largest tensor-parallel size that fits: among the startable
    candidates with no pipeline parallelism, ``kv_cache_dtype`` auto, CUDA graphs on and
    vLLM's default ``max_num_batched_tokens`` for the card (vllm/engine/arg_utils.py
    get_batch_defaults, as app.planner.vllm_rules has it), the largest TP (data parallel
    over the rest of the cards)."""
    card = lookup_gpu(gpu)
    mnbt = rules_for(version).batch_defaults(card.memory_gib, card.name)[1]
    ok = [c for c in cands if c.pruned_because is None and (c.config.pipeline_parallel_size or 1) == 1
          and c.config.kv_cache_dtype in (None, "auto") and not c.config.enforce_eager
          and c.config.max_num_batched_tokens == max(mnbt, c.config.max_num_seqs or 0)]
    return max(ok, key=lambda c: (c.config.tensor_parallel_size or 1), default=None)


def engine_hash(sources: tuple[str, ...] = ENGINE_SOURCES) -> str:
    """A digest of the ``sources`` (files or folders of the checkout): what a cached figure depends on."""
    h = hashlib.sha256()
    for name in sources:
        p = ROOT / name
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _entry(d: dict | None) -> GridEntry | None:
    return GridEntry(**d) if d is not None else None


def grid_of(case: tuple, label: str, truth_file: Path | None, rig: OfflineRig, cands: list[Candidate],
            use_cache: bool) -> dict:
    """The case's grid under a truth: ``single`` (key → GridEntry of one search, None where
    it cannot serve), ``true`` (key → the mean of enough searches: the top
    :data:`TOP_REPEATED` and whatever :func:`true_of` adds), its rig minutes and CPU s."""
    text = truth_file.read_text() if truth_file else f"perturb {case[-1]}"
    key = hashlib.sha256(f"{case[:9]!r}|{text}|{engine_hash()}".encode()).hexdigest()[:20]
    path = CACHE / f"case{case[0]}-{label}-{key}.json"  # (cached() names it alike)
    if use_cache and path.exists():
        d = json.loads(path.read_text())
        return {"single": {k: _entry(v) for k, v in d["single"].items()},
                "true": {k: _entry(v) for k, v in d["true"].items()}, "rig_s": d["rig_s"], "cpu_s": d["cpu_s"],
                "path": path, "cached": True}
    cpu0 = time.process_time()
    single: dict[str, GridEntry | None] = {}
    rig_s = 0.0
    for c in cands:
        if c.pruned_because is not None:
            continue
        try:
            pred, s = rig.search(c.config)
        except ma.Refusal:
            pred, s = None, 0.0
        cap = pred.capacity if pred is not None else None
        single[c.key] = (GridEntry(cap.users, cap.users_low, cap.users_high, cap.output_tps, 1, s)
                         if cap is not None else None)
        rig_s += s
    top = sorted((k for k, e in single.items() if e is not None), key=lambda k: -single[k].users)[:TOP_REPEATED]
    by_key = {c.key: c for c in cands}
    true = {k: rig.true_capacity(by_key[k].config, least=1) for k in top}
    g = {"single": single, "true": true, "rig_s": rig_s, "cpu_s": time.process_time() - cpu0, "path": path,
         "cached": False}
    _save(g)
    return g


def _save(g: dict) -> None:
    path: Path = g["path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    js = {k: (v.__dict__ if v is not None else None) for k, v in g["single"].items()}
    jt = {k: (v.__dict__ if v is not None else None) for k, v in g["true"].items()}
    path.write_text(json.dumps({"single": js, "true": jt, "rig_s": g["rig_s"], "cpu_s": g["cpu_s"]}))


def true_of(g: dict, key: str, rig: OfflineRig, cand: Candidate) -> float:
    """``key``'s true users (the mean of enough searches), computed and cached when missing;
    0 where it serves none."""
    if key not in g["true"]:
        if g["single"].get(key) is None:
            return 0.0
        g["true"][key] = rig.true_capacity(cand.config)
        _save(g)
    e = g["true"][key]
    return e.users if e is not None else 0.0


def figure(g: dict, key: str) -> float:
    """The grid's figure of ``key``: its mean where computed, else its single search, 0
    where it serves none."""
    e = g["true"].get(key) or g["single"].get(key)
    return e.users if e is not None else 0.0


def cached(case: tuple, label: str, truth_file: Path | None) -> bool:
    """Whether the grid of ``case`` under a truth is in the cache (:func:`grid_of`'s key)."""
    text = truth_file.read_text() if truth_file else f"perturb {case[-1]}"
    key = hashlib.sha256(f"{case[:9]!r}|{text}|{engine_hash()}".encode()).hexdigest()[:20]
    return (CACHE / f"case{case[0]}-{label}-{key}.json").exists()


def run_case(case: tuple, label: str, truth_file: Path | None, *, offline: bool, spot: bool, store: RunStore,
             use_cache: bool, tuner_too: bool = True) -> dict:
    n, gpu, count, model, quant, wname, pt, ot, slo, seed = case
    cfg = ServerConfig(model=model, served_model_name="m", quantization=quant, max_model_len=8192)
    truth = load_truth(truth_file) if truth_file is not None else None
    seed = seed if truth is None else 0

    def spec_at(k: float) -> TuneSpec:
        sim = ["--sim-gpu", gpu, "--sim-gpu-count", str(count), "--sim-time-scale", f"{k:g}", "--sim-seed", "1"]
        sim += ["--sim-perturb", str(seed)] if seed else []
        sim += ["--sim-truth", json.dumps(truth.mapping(), separators=(",", ":"))] if truth is not None else []
        return TuneSpec(engine="sim", config=cfg, sim_args=sim, hardware=HardwareFingerprint(gpu=gpu, count=count),
                        vllm_version=ma.VLLM_RULES, prompt_tokens=pt, output_tokens=ot, slo=slo, grace=5)

    spec = spec_at(10)
    rig = OfflineRig(spec, seed, truth)
    cands = enumerate_candidates(cfg, [lookup_gpu(gpu)] * count, spec.space, spec.workload(), spec.vllm_version)
    by_key = {c.key: c for c in cands}
    g = grid_of(case, label, truth_file, rig, cands, use_cache)
    served = {k: figure(g, k) for k in g["single"]}
    best_key = max(g["true"], key=lambda k: g["true"][k].users if g["true"][k] else 0.0)
    best = g["true"][best_key]
    assert best is not None
    dflt = defaults_candidate(cands, gpu, spec.vllm_version)
    dflt_users = true_of(g, dflt.key, rig, dflt) if dflt is not None else 0.0
    served = {k: figure(g, k) for k in g["single"]}
    rand4 = random_best_expectation(list(served.values()))
    out = {"case": case, "truth": label, "grid": g, "grid_n": len(g["single"]), "all": len(cands),
           "best_key": best_key, "best": best, "defaults_key": dflt.key if dflt else None, "defaults": dflt_users,
           "random4": rand4}
    k = min(MAX_K, WALL_TOKENS_PER_S / max(1.0, best.output_tps or 1.0))
    http_ok = k >= 1.0
    spots = []
    if spot and http_ok:
        for key in sorted(g["true"], key=lambda x: -figure(g, x))[:3]:
            ctl = RunController(store=store)
            ramp = spec.workload().search_spec()
            start = float(max(1, round(figure(g, key))))
            ramp = ramp.model_copy(update={"search": ramp.search.model_copy(update={"start": start})})
            m = ControllerRig(spec_at(k), ctl).measure(by_key[key].config, ramp, RecordSpec(name=f"spot {key}"),
                                                       lambda: None)
            ctl.close()
            spots.append((key, g["true"][key], m.capacity, m.error))
    out["spots"] = spots
    if not tuner_too:
        return out
    if not (offline or http_ok):
        out["skipped"] = (f"HTTP: the rig's {best.output_tps:.0f} tok/s at its capacity is more than 2 cores "
                          f"stream (k = {k:.2f} < 1): run with --offline")
        return out
    t0 = time.monotonic()
    tuner = Tuner(spec if offline else spec_at(k), store=store, rig=rig if offline else None)
    tuner.run()
    res = tuner.result()
    out["tune_s"] = time.monotonic() - t0
    res["k"] = k if not offline else None
    pick = (res["recommendation"] or {}).get("key")
    out.update(tuner=res, pick=pick, pick_true=true_of(g, pick, rig, by_key[pick]) if pick in by_key else 0.0)
    return out


HEADER = (f"{'#':>2} {'rig':12} {'model':8} {'workload':13} {'truth':22} {'grid':>4} {'grid rig min':>12} "
          f"{'launches':>8} {'rig min':>7} {'pick/best':>9} {'defaults':>8} {'random-4':>8}  ok  pick · best")


def row(r: dict) -> tuple[str, bool]:
    n, gpu, count, model, quant, wname = r["case"][:6]
    best = r["best"].users
    t = r["tuner"]
    frac = r["pick_true"] / best if best else 0.0
    ok = frac >= 0.95 and t["launches"] <= 4 and r["pick_true"] >= r["random4"] - 1e-9
    line = (f"{n:2d} {count}× {gpu:9} {'70B AWQ' if quant else '8B bf16':8} {wname:13} {r['truth']:22} "
            f"{r['grid_n']:4d} {r['grid']['rig_s'] / 60:12.1f} {t['launches']:8d} {t['rig_seconds'] / 60:7.1f} "
            f"{frac:9.2f} {r['defaults'] / best if best else 0:8.2f} {r['random4'] / best if best else 0:8.2f}  "
            f"{'✓' if ok else '✗':2}  {r['pick_true']:.1f} {r['pick']} · {best:.1f} {r['best_key']}")
    return line, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--offline", action="store_true", help="the tuner measures on the offline engine (no HTTP)")
    ap.add_argument("--spot-check", action="store_true", help="measure the grid's top three over HTTP")
    ap.add_argument("--cases", help="comma list of case numbers (1–8)")
    ap.add_argument("--truths", help="comma list of truths: perturb and truth files' stems (default: all)")
    ap.add_argument("--spot-only", action="store_true", help="with --spot-check: the grid and its spot-checks, no tune")
    ap.add_argument("--no-cache", action="store_true", help=f"compute every grid again (default: cached in {CACHE})")
    ap.add_argument("--cached-only", action="store_true", help="only the case × truths whose grid is cached")
    ap.add_argument("--verbose", action="store_true", help="each measured candidate of each tune")
    a = ap.parse_args()
    chosen = cases()
    if a.cases:
        want = {int(x) for x in a.cases.split(",")}
        chosen = [c for c in chosen if c[0] in want]
    ts = truths()
    if a.truths:
        names = [x.strip() for x in a.truths.split(",") if x.strip()]
        unknown = [x for x in names if x not in {t for t, _ in ts}]
        if unknown:
            ap.error(f"--truths {','.join(unknown)}: choose from {', '.join(t for t, _ in ts)}")
        ts = [next(t for t in ts if t[0] == name) for name in names]  # in the order given
    store = RunStore(Path(tempfile.mkdtemp()) / "tune.sqlite")
    print("pick/best, defaults and random-4 as fractions of the grid's best (true users: means of searches, "
          "one user ≤ 2 % of each); ok: pick ≥ 0.95 in ≤ 4 launches and ≥ random-4", flush=True)
    print(HEADER, flush=True)
    oks, fracs, lines = [], [], []
    for case in chosen:
        for label, f in ts:
            if a.cached_only and not cached(case, label, f):
                continue
            r = run_case(case, label, f, offline=a.offline, spot=a.spot_check or a.spot_only, store=store,
                         use_cache=not a.no_cache, tuner_too=not a.spot_only)
            for key, off, http, err in r["spots"]:
                print(f"{case[0]:2d}   spot-check {key}: offline {off.users:.2f} ({off.users_low:g}–{off.users_high:g}), "
                      "over HTTP " + (f"{http.users:g} ({http.users_low:g}–{http.users_high:g})" if http
                                      else f"failed: {err}"), flush=True)
            if a.spot_only:
                continue
            if r.get("skipped"):
                print(f"{case[0]:2d} {label:22} {r['skipped']}", flush=True)
                continue
            line, ok = row(r)
            lines.append(line)
            oks.append(ok)
            fracs.append(r["pick_true"] / r["best"].users if r["best"].users else 0.0)
            print(line, flush=True)
            t = r["tuner"]
            print(f"{'':5}stop: {t['stop_reason']}; tuner wall {r['tune_s']:.0f} s; grid "
                  f"{'cached' if r['grid']['cached'] else 'computed'} ({r['grid']['cpu_s']:.0f} CPU s); "
                  f"{r['grid_n']} startable of {r['all']}; defaults {r['defaults_key']}", flush=True)
            if a.verbose:
                for c in t["candidates"]:
                    if c["measured_users"] is not None or c["failed"]:
                        print(f"{'':5}measured {c['key']}: first predicted {c['first_predicted_users']}, measured "
                              f"{c['measured_users']}, now predicted {c['predicted_users']}; grid "
                              f"{figure(r['grid'], c['key']):.1f}{' FAILED ' + c['failed'] if c['failed'] else ''}")
    if fracs:
        print()
        print(HEADER)
        print("\n".join(lines))
        print(f"worst pick/best {min(fracs):.2f}; ok {sum(oks)} of {len(oks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
