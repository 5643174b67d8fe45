"""How close is the performance model to real GPUs? (issue 34, item 4.)

Every set of the library of published vLLM GPU runs (``benchmarks/data/realgpu/*.yaml``,
:mod:`app.planner.realruns`) goes through :func:`app.planner.benchserve.predict_bench` —
the code of ``vllm-dyno predict`` — point by point: the set's ``vllm serve`` options with
the point's overrides (``ServerConfig.from_vllm_config``: named options, the rest as
extra arguments; ``env`` as the server's environment), the cards (``hardware.gpu`` ×
the point's TP × PP × DP), the model and vLLM version of the point, and the benchmark as
:class:`app.planner.benchserve.BenchArgs` (the options it knows; the client's other
options — backend, endpoint, temperature … — change nothing the engine models). Each
``assumed`` value of the set is applied where the set does not give the field. The
saved calibration of this machine is never used (``use_calibration=False``).

Request lengths. ``random``: vLLM's own sampling (:func:`app.planner.benchserve.random_lengths`).
Datasets whose lengths a set does not give per request (ShareGPT, a Hugging Face set):
the built-in ShareGPT shape (:func:`app.loadgen.datasets.builtin_chat`: log-normals,
vLLM's pruning) rescaled to mean lengths taken, in this order, from the point's own
published totals (``total_input_tokens`` / ``total_output_tokens`` ÷ ``completed``;
output ÷ requests from ``output_throughput`` / ``request_throughput``), else the
dataset's reference means below (:data:`DATASET_MEANS`, each with its source). These
reference means are an assumption of the benchmark and get a sensitivity run of their
own (low/high), as the set's ``assumed`` values do.

Figures, per point, as ``(predicted − measured) / measured``:

- ``tput``: ``output_throughput``; where a point publishes no output tok/s,
  ``total_token_throughput``, else ``request_throughput``;
- ``ttft``: ``mean_ttft_ms``, else ``median_ttft_ms`` (same key predicted); ``ttft_p99``;
- ``tpot``: ``mean_tpot_ms``, else ``median_tpot_ms``, else ``median_itl_ms``; ``tpot_p99``.

Per set and overall (fitted — role ``fit`` — and validation sets apart): the median
|error| of each, the share of points within ±10 % (throughput). A point the model
refuses (vLLM would not serve it, or it does not fit) counts 100 % on every figure it
publishes and is listed.

Comparisons (``comparisons`` of a set): the measured figure of each point (÷ cards with
``per_gpu``) against the predicted one: Kendall τ-b of the two orders; "same winner":
the model's best point measured within 3 % of the measured best; top-1 and top-3 regret:
how far the measured value of the best of the model's top k falls short of the measured
best (in % of it; lower-is-better figures the other way round).

Sensitivity: each ``assumed`` entry with a ``low``/``high`` other than its value, and the
dataset-mean assumption, is rerun at both ends; the set's median |error| of each figure
at low / value / high is printed, with the spread (the largest minus the smallest).

Usage: ``.venv/bin/python benchmarks/real_gpu_fidelity.py [--json F] [--set ID …]
[--no-sensitivity] [--points]``. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import ServerConfig  # noqa: E402
from app.loadgen.datasets import builtin_chat  # noqa: E402
from app.planner.benchserve import GENERATED_DATASETS, BenchArgs, BenchInputError, predict_bench  # noqa: E402
from app.planner.model_error import TABLE_PATH, PointError, build_table, offered_concurrency  # noqa: E402
from app.planner.models import resolve_model  # noqa: E402
from app.planner.realruns import DEFAULT_FOLDER, Point, RealRunSet, load_sets, lower_is_better  # noqa: E402

#: Mean (prompt, output) tokens per request of a dataset when a point publishes no totals,
#: with the (low, high) alternatives its sensitivity run takes. ShareGPT_V3 as vLLM's
#: benchmark samples it (prompt 4–1024, total ≤ 2048, the reply's length as output):
#: 214 / 200 with the Llama-3 tokenizer — 213,987 prompt and 199,774 output tokens over
#: 1,000 requests, seed 0, in the zhjunqin/LLM-Learning run of the library (its
#: published totals); low: the PagedAttention paper's means (Kwon et al., SOSP 2023,
#: §6.1: 161 / 338, Llama tokenizer, unpruned); high: 300 / 200. AI-MO/aimo-validation-aime
#: (vLLM's AIMODataset: the problem as prompt, the reference solution's token count as
#: output): assumed 130 / 1,500 (problems of a few sentences; solutions of one to two
#: pages), range 100 / 800 … 200 / 3,000 — the source says neither.
DATASET_MEANS: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "sharegpt": ((214.0, 200.0), (161.31, 337.99), (300.0, 200.0)),
    "hf": ((130.0, 1500.0), (100.0, 800.0), (200.0, 3000.0)),
}

#: the bench options BenchArgs takes (the others are the client's, not the server's work)
BENCH_FIELDS = set(BenchArgs.model_fields) - {"lengths_file"}

#: requests per point in the sensitivity runs: each assumption's low, value and high run with at most
#: this many requests (the figures of a 5,000-request burst move little beyond it; the spread compares
#: runs of one size)
SENS_CAP = 200

FIGURES = ("tput", "ttft", "tpot", "ttft_p99", "tpot_p99")
#: per figure: the published keys it may use, in order of preference
FIGURE_KEYS = {
    "tput": ("output_throughput", "total_token_throughput", "request_throughput"),
    "ttft": ("mean_ttft_ms", "median_ttft_ms"),
    "tpot": ("mean_tpot_ms", "median_tpot_ms", "median_itl_ms"),
    "ttft_p99": ("p99_ttft_ms",),
    "tpot_p99": ("p99_tpot_ms",),
}
HEAD = {"tput": "tok/s", "ttft": "TTFT", "tpot": "TPOT", "ttft_p99": "TTFT p99", "tpot_p99": "TPOT p99"}


# ---------------------------------------------------------------------- configuration of a point
_POINT_FIELD = re.compile(r"points\[([^\]]+)\]\.(.+)")


def _set_path(d: dict[str, Any], path: str, value: Any, override: bool) -> None:
    """``d[a][b] = value`` for ``path`` ``a.b`` (only when unset unless ``override``)."""
    keys = path.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    if override or keys[-1] not in d:
        d[keys[-1]] = value


@dataclass
class PointConfig:
    """What one point runs: model, cards, version, serve options, env, bench options."""

    model: str
    gpu: str
    count: int
    version: str
    serve: dict[str, Any]
    env: dict[str, str]
    bench: dict[str, Any]
    p2p: bool | None = None


def point_config(rs: RealRunSet, p: Point, forced: dict[str, Any] | None = None) -> PointConfig:
    """The point's configuration: the set's options, the point's overrides, the set's
    ``assumed`` values where not given, then ``forced`` (an assumption's low/high:
    dotted path → value, overriding)."""
    cfg: dict[str, Any] = {"model": rs.model_of(p), "vllm_version": rs.version_of(p),
                           "hardware": {"gpu": rs.hardware.gpu, "p2p": rs.hardware.p2p}, "serve": rs.serve_of(p), "env": rs.env_of(p),
                           "bench": rs.bench_of(p)}
    given_model, given_version = p.model is not None, p.vllm_version is not None

    def apply(path: str, value: Any, override: bool) -> None:
        m = _POINT_FIELD.fullmatch(path)
        if m:
            if m.group(1) != p.label:
                return
            path = m.group(2)
        if path in ("model", "vllm_version"):
            if override or not (given_model if path == "model" else given_version):
                cfg[path] = value
            return
        if isinstance(value, str) and " x " in value:  # "60 x request_rate": a rule, not a value
            return
        if value is None:
            return
        _set_path(cfg, path, value, override)

    for a in rs.assumed:
        apply(a.field, a.value, False)
    for path, value in (forced or {}).items():
        apply(path, value, True)
    serve = dict(cfg["serve"])
    ranks = 1
    for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        ranks *= int(serve.get(k) or 1)
    return PointConfig(str(cfg["model"]), str(cfg["hardware"]["gpu"]), ranks, str(cfg["vllm_version"]), serve,
                       {k: str(v) for k, v in cfg["env"].items()}, dict(cfg["bench"]), cfg["hardware"].get("p2p"))


def point_lengths(pc: PointConfig, p: Point, means: tuple[float, float] | None) -> list[tuple[int, int]] | None:
    """Per-request lengths for a dataset other than ``random`` (module docstring), None
    for ``random`` (vLLM's sampling in predict_bench)."""
    ds = pc.bench.get("dataset_name", "random")
    if ds in GENERATED_DATASETS:
        return None
    n = int(pc.bench.get("num_prompts", 1000))
    ref = means or DATASET_MEANS.get(ds, DATASET_MEANS["sharegpt"])[0]
    m = p.measured
    done = m.get("completed")
    mean_in = m["total_input_tokens"] / done if done and "total_input_tokens" in m else ref[0]
    if done and "total_output_tokens" in m:
        mean_out = m["total_output_tokens"] / done
    elif m.get("request_throughput") and m.get("output_throughput"):
        mean_out = m["output_throughput"] / m["request_throughput"]
    else:
        mean_out = ref[1]
    seed = int(pc.bench.get("seed", 0))
    base = builtin_chat(n, seed)
    bi = sum(e.prompt_tokens for e in base) / n
    bo = sum(e.answer_tokens for e in base) / n
    mml = int(pc.serve.get("max_model_len") or 1 << 30)
    out = []
    for e in base:
        i = max(1, round(e.prompt_tokens * mean_in / bi))
        o = max(1, round(e.answer_tokens * mean_out / bo))
        if i + o > mml:  # vLLM's client would not have sent it past the server's limit unpruned; clip output
            o = max(1, mml - i)
        out.append((i, o))
    return out


def bench_args(pc: PointConfig, lengths: list | None) -> BenchArgs:
    kw = {k: v for k, v in pc.bench.items() if k in BENCH_FIELDS}
    if lengths is not None:
        kw["dataset_name"] = "random"  # the lengths are given; the dataset's name is only a label here
        kw["num_prompts"] = len(lengths)
    if isinstance(kw.get("request_rate"), str):
        kw["request_rate"] = math.inf if kw["request_rate"] == "inf" else float(kw["request_rate"])
    return BenchArgs(**kw)


def point_job(rs: RealRunSet, p: Point, forced: dict[str, Any] | None = None,
              means: tuple[float, float] | None = None, cap: int | None = None) -> tuple[str, tuple]:
    """(a key of what the point runs, the arguments of :func:`run_job`): two runs of the
    same configuration and lengths share one prediction. ``cap``: at most that many
    requests (the sensitivity runs)."""
    pc = point_config(rs, p, forced)
    lengths = point_lengths(pc, p, means)
    if cap is not None:
        n = int(pc.bench.get("num_prompts", 1000))
        if lengths is not None:
            lengths = lengths[:cap]
        elif n > cap:
            pc.bench["num_prompts"] = cap
    key = json.dumps([pc.model, pc.gpu, pc.count, pc.version, pc.serve, pc.env, pc.bench, pc.p2p, lengths],
                     sort_keys=True, default=str)
    return key, (pc, lengths)


def run_job(pc: PointConfig, lengths: list | None) -> tuple[dict[str, Any] | None, str | None]:
    """(predicted figures, None) or (None, why the model refused the point)."""
    config = ServerConfig.from_vllm_config({"model": pc.model, **pc.serve}, env=pc.env)
    try:
        bench = bench_args(pc, lengths)
        fig = predict_bench(pc.model, pc.gpu, pc.count, pc.version, config, bench, lengths=lengths,
                            use_calibration=False, p2p=pc.p2p)
    except BenchInputError as e:
        return None, str(e)[:160]
    except ValueError as e:
        return None, f"{type(e).__name__}: {str(e)[:160]}"
    return fig, None


def _cost(args: tuple) -> float:
    """Rough engine work of a job (tokens), to hand out the longest first."""
    pc, lengths = args
    if lengths is not None:
        return float(sum(i + o for i, o in lengths))
    b = pc.bench
    return float(b.get("num_prompts", 1000)) * (b.get("random_input_len", 1024) + b.get("random_output_len", 128))


class Runner:
    """Runs jobs once each (by key), in ``jobs`` processes."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.done: dict[str, tuple[dict[str, Any] | None, str | None]] = {}

    def run(self, todo: dict[str, tuple]) -> None:
        todo = {k: v for k, v in todo.items() if k not in self.done}
        order = sorted(todo, key=lambda k: -_cost(todo[k]))
        if self.jobs <= 1 or len(order) <= 1:
            for k in order:
                self.done[k] = run_job(*todo[k])
            return
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(self.jobs, mp_context=mp.get_context("fork")) as ex:
            futs = {k: ex.submit(run_job, *todo[k]) for k in order}
            for k, f in futs.items():
                self.done[k] = f.result()


# ---------------------------------------------------------------------- errors
def point_errors(p: Point, pred: dict[str, Any] | None) -> dict[str, tuple[str, float, float | None, float]]:
    """Per figure the point publishes: (key, measured, predicted, error %); a refused
    point: predicted None and error 100 %."""
    out = {}
    for fig, keys in FIGURE_KEYS.items():
        key = next((k for k in keys if k in p.measured and p.measured[k] > 0), None)
        if key is None:
            continue
        meas = p.measured[key]
        if pred is None:
            out[fig] = (key, meas, None, 100.0)
            continue
        pv = pred.get(key)
        if key == "median_itl_ms" and pv is None:
            pv = pred.get("median_tpot_ms")
        err = 100.0 * (pv - meas) / meas if pv is not None else 100.0
        out[fig] = (key, meas, pv, err)
    return out


def median_abs(errs: list[float]) -> float | None:
    return statistics.median(abs(e) for e in errs) if errs else None


def kendall_tau_b(x: list[float], y: list[float]) -> float | None:
    """Kendall's τ-b of two equal-length sequences (None when either is constant)."""
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            a, b = x[i] - x[j], y[i] - y[j]
            if a == 0 and b == 0:
                continue
            if a == 0:
                tx += 1
            elif b == 0:
                ty += 1
            elif (a > 0) == (b > 0):
                conc += 1
            else:
                disc += 1
    den = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / den if den else None


@dataclass
class CompResult:
    name: str
    figure: str
    measured: list[float]
    predicted: list[float | None]
    tau: float | None = None
    same_winner: bool = False
    regret1: float = 0.0
    regret3: float = 0.0


def compare(rs: RealRunSet, comp, preds: dict[str, dict[str, Any] | None]) -> CompResult:
    lower = lower_is_better(comp.figure)
    meas, pred = [], []
    for lab in comp.points:
        p = rs.point(lab)
        k = rs.gpus_of(p) if comp.per_gpu else 1
        meas.append(p.measured[comp.figure] / k)
        pv = (preds.get(lab) or {}).get(comp.figure)
        pred.append(pv / k if pv is not None else None)
    r = CompResult(comp.name, comp.figure, meas, pred)
    sign = -1.0 if lower else 1.0
    best = max(meas, key=lambda v: sign * v)
    # a refused point ranks last in the model's order
    order = sorted(range(len(meas)), key=lambda i: -math.inf if pred[i] is None else sign * pred[i], reverse=True)
    r.tau = kendall_tau_b([sign * v for v in meas],
                          [sign * v if v is not None else -1e300 for v in pred])

    def regret(k: int) -> float:
        got = max((meas[i] for i in order[:k]), key=lambda v: sign * v)
        return 100.0 * sign * (best - got) / abs(best) if best else 0.0

    r.regret1, r.regret3 = regret(1), regret(3)
    r.same_winner = r.regret1 <= 3.0
    return r


@dataclass
class SetResult:
    rs: RealRunSet
    points: dict[str, dict[str, tuple]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    comps: list[CompResult] = field(default_factory=list)
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    predicted: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def errs(self, fig: str) -> list[float]:
        return [e[fig][3] for e in self.points.values() if fig in e]

    def summary(self) -> dict[str, Any]:
        return {f: median_abs(self.errs(f)) for f in FIGURES}


def set_jobs(rs: RealRunSet, forced: dict[str, Any] | None = None, means: tuple[float, float] | None = None,
             cap: int | None = None) -> tuple[dict[str, str], dict[str, tuple]]:
    """(point label → job key, job key → arguments) of one run of the set."""
    keys, todo = {}, {}
    for p in rs.points:
        k, args = point_job(rs, p, forced, means, cap)
        keys[p.label] = k
        todo[k] = args
    return keys, todo


def assemble(rs: RealRunSet, keys: dict[str, str], runner: Runner) -> SetResult:
    res = SetResult(rs)
    preds: dict[str, dict[str, Any] | None] = {}
    for p in rs.points:
        pred, why = runner.done[keys[p.label]]
        preds[p.label] = pred
        if why:
            res.refused[p.label] = why
        res.points[p.label] = point_errors(p, pred)
    res.comps = [compare(rs, c, preds) for c in rs.comparisons]
    res.predicted = preds
    return res


def sensitivity_cases(rs: RealRunSet) -> list[dict[str, Any]]:
    """The set's assumptions with a range: ``field``, ``value``, ``low``, ``high`` and
    per end the forced values and dataset means of its run."""
    cases = []
    for a in rs.assumed:
        alts = [v for v in (a.low, a.high) if v is not None and v != a.value]
        if not alts or (isinstance(a.value, str) and " x " in a.value):
            continue
        ends = {end: ({a.field: v}, None) for end, v in (("low", a.low), ("high", a.high))
                if v is not None and v != a.value}
        cases.append({"field": a.field, "value": a.value, "low": a.low, "high": a.high, "ends": ends})
    for ds in sorted({rs.bench_of(p).get("dataset_name", "random") for p in rs.points} - {"random"}):
        uses_ref = any(not (p.measured.get("completed") and "total_input_tokens" in p.measured)
                       for p in rs.points if rs.bench_of(p).get("dataset_name") == ds)
        if not uses_ref:
            continue
        ref, lo, hi = DATASET_MEANS.get(ds, DATASET_MEANS["sharegpt"])
        cases.append({"field": f"{ds} mean lengths where unpublished", "value": list(ref), "low": list(lo),
                      "high": list(hi), "ends": {"low": ({}, lo), "high": ({}, hi)}})
    return cases


# ---------------------------------------------------------------------- report
def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "—"
    return f"{v:+.0f}%" if signed else f"{v:.0f}%"


def group_summary(results: list[SetResult]) -> dict[str, Any]:
    out: dict[str, Any] = {"sets": len(results), "points": sum(len(r.points) for r in results),
                           "refused": sum(len(r.refused) for r in results)}
    for f in FIGURES:
        errs = [e for r in results for e in r.errs(f)]
        out[f] = {"median_abs": median_abs(errs), "n": len(errs),
                  "median_signed": statistics.median(errs) if errs else None,
                  "within10": sum(abs(e) <= 10 for e in errs)}
    comps = [c for r in results for c in r.comps]
    out["comparisons"] = len(comps)
    out["same_winner"] = sum(c.same_winner for c in comps)
    taus = [c.tau for c in comps if c.tau is not None]
    out["mean_tau"] = statistics.mean(taus) if taus else None
    out["max_top1_regret"] = max((c.regret1 for c in comps), default=None)
    out["max_top3_regret"] = max((c.regret3 for c in comps), default=None)
    out["top3_regret_le5"] = sum(c.regret3 <= 5.0 for c in comps)
    return out


def print_report(results: list[SetResult], show_points: bool) -> dict[str, Any]:
    figs = {}
    for role in ("fit", "validation"):
        group = [r for r in results if r.rs.role == role]
        if not group:
            continue
        title = "FITTED sets (role fit)" if role == "fit" else "VALIDATION sets (never fitted)"
        print(f"\n== {title}")
        print(f"{'set':<44} {'pts':>3} " + " ".join(f"{HEAD[f]:>9}" for f in FIGURES) + "  comparisons")
        for r in group:
            s = r.summary()
            wins = sum(c.same_winner for c in r.comps)
            ctext = (f"{wins}/{len(r.comps)} same winner, top-1 regret ≤{max(c.regret1 for c in r.comps):.0f}%, "
                     f"top-3 ≤{max(c.regret3 for c in r.comps):.0f}%") if r.comps else ""
            print(f"{r.rs.id:<44} {len(r.points):>3} " + " ".join(f"{_pct(s[f]):>9}" for f in FIGURES) + "  " + ctext)
            if r.refused:
                for lab, why in r.refused.items():
                    print(f"    refused {lab}: {why}")
            if show_points:
                for lab, e in r.points.items():
                    print(f"    {lab:<28} " + "  ".join(
                        f"{f} {k} {m:.4g}→{(pv if pv is not None else float('nan')):.4g} ({err:+.0f}%)"
                        for f, (k, m, pv, err) in e.items()))
                for c in r.comps:
                    print(f"    cmp {c.name}: measured {[round(v, 3) for v in c.measured]} predicted "
                          f"{[round(v, 3) if v is not None else None for v in c.predicted]} τ {c.tau} "
                          f"same {c.same_winner} regret {c.regret1:.1f}/{c.regret3:.1f}")
            for row in r.sensitivity:
                e = row["median_abs_error"]
                parts = []
                for end in ("low", "value", "high"):
                    if end in e:
                        parts.append(f"{end} " + "/".join(_pct(e[end][f]) for f in ("tput", "ttft", "tpot")))
                sp = row["spread"]
                print(f"    assumed {row['field']} ({row['low']} … {row['high']}): " + ", ".join(parts)
                      + "  spread " + "/".join(_pct(sp[f]) for f in ("tput", "ttft", "tpot"))
                      + " (tok/s/TTFT/TPOT; runs of ≤ SENS_CAP requests)".replace("SENS_CAP", str(SENS_CAP)))
        g = group_summary(group)
        figs[role] = g
        print(f"{'ALL ' + role:<44} {g['points']:>3} " + " ".join(f"{_pct(g[f]['median_abs']):>9}" for f in FIGURES)
              + f"  {g['same_winner']}/{g['comparisons']} same winner, mean τ "
              + (f"{g['mean_tau']:+.2f}" if g["mean_tau"] is not None else "—")
              + f", top-1 regret ≤{_pct(g['max_top1_regret'])}, top-3 ≤{_pct(g['max_top3_regret'])}")
        print(f"{'':<44}     " + " ".join(f"{'n=' + str(g[f]['n']):>9}" for f in FIGURES)
              + f"  tok/s within ±10 %: {g['tput']['within10']} of {g['tput']['n']}; signed medians "
              + "/".join(_pct(g[f]["median_signed"], True) for f in ("tput", "ttft", "tpot"))
              + f"; refused {g['refused']}")
    figs["all"] = group_summary(results)
    return figs


def to_json(results: list[SetResult], figs: dict[str, Any], seconds: float) -> dict[str, Any]:
    sets = []
    for r in results:
        sets.append({
            "id": r.rs.id, "role": r.rs.role, "summary": r.summary(), "refused": r.refused,
            "points": {lab: {f: {"key": k, "measured": m, "predicted": pv, "error_pct": err}
                             for f, (k, m, pv, err) in e.items()} for lab, e in r.points.items()},
            "comparisons": [{"name": c.name, "figure": c.figure, "measured": c.measured, "predicted": c.predicted,
                             "kendall_tau": c.tau, "same_winner": c.same_winner, "top1_regret_pct": c.regret1,
                             "top3_regret_pct": c.regret3} for c in r.comps],
            "sensitivity": r.sensitivity})
    return {"overall": figs, "sets": sets, "seconds": seconds}


# ---------------------------------------------------------------------- the product's error table
def point_load(pc: PointConfig, p: Point, pred: dict[str, Any] | None) -> float:
    """Concurrent requests per engine at the point (:func:`app.planner.model_error.offered_concurrency`;
    the measured mean latency, else the predicted one)."""
    b = pc.bench
    return offered_concurrency(b.get("max_concurrency"), b.get("request_rate"), float(b.get("num_prompts", 1000)),
                               p.measured.get("request_throughput"),
                               p.measured.get("mean_e2el_ms") or (pred or {}).get("mean_e2el_ms"),
                               int(pc.serve.get("data_parallel_size") or 1))


def error_points(results: list[SetResult]) -> list[PointError]:
    """Every point of ``results`` as the error table takes it (its tok/s, TTFT and TPOT
    errors; a refused point's 100 %)."""
    out = []
    for r in results:
        rs = r.rs
        for p in rs.points:
            pc = point_config(rs, p)
            q = pc.serve.get("quantization") or resolve_model(pc.model).quant_method
            errs = {f: e[3] for f, e in r.points[p.label].items() if f in ("tput", "ttft", "tpot")}
            out.append(PointError(pc.gpu, round(point_load(pc, p, r.predicted.get(p.label)), 2), pc.count,
                                  q or None, rs.role, rs.id, errs))
    return out


def library_digest(folder: str | Path) -> str:
    """"N sets, sha256 …" of the library's YAML files (names and contents), so a table
    says what it was computed from."""
    import hashlib

    h = hashlib.sha256()
    files = sorted(Path(folder).glob("*.yaml"))
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return f"benchmarks/data/realgpu: {len(files)} files, sha256 {h.hexdigest()[:16]}"


def error_table(results: list[SetResult], folder: str | Path) -> dict[str, Any]:
    """The table :mod:`app.planner.model_error` ships, from these results."""
    return build_table(error_points(results), library_digest(folder))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default=str(ROOT / DEFAULT_FOLDER), help="the library (default: the checkout's)")
    ap.add_argument("--set", action="append", default=[], help="only this set id (repeatable)")
    ap.add_argument("--json", metavar="F", help="write the figures to F ('-': stdout)")
    ap.add_argument("--no-sensitivity", action="store_true", help="skip the low/high reruns of the assumptions")
    ap.add_argument("--points", action="store_true", help="print every point and comparison")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--write-error-table", nargs="?", const=str(TABLE_PATH), metavar="F",
                    help="write the product's error table (default: app/planner/data/model_error.json) "
                         "from the whole library (no --set)")
    ap.add_argument("--sens-cap", type=int, default=SENS_CAP,
                    help=f"requests per point in the sensitivity runs (default {SENS_CAP})")
    a = ap.parse_args(argv)
    if a.write_error_table and a.set:
        ap.error("--write-error-table takes the whole library: leave out --set")
    t0 = time.perf_counter()
    sets = [s for s in load_sets(a.folder) if not a.set or s.id in a.set]
    runner = Runner(a.jobs)
    base, todo = {}, {}
    for rs in sets:
        keys, t = set_jobs(rs)
        base[rs.id] = keys
        todo.update(t)
    runner.run(todo)
    results = [assemble(rs, base[rs.id], runner) for rs in sets]
    if not a.no_sensitivity:
        plans, todo = {}, {}
        for rs in sets:
            cases = sensitivity_cases(rs)
            if not cases:
                continue
            keys, t = set_jobs(rs, cap=a.sens_cap)
            todo.update(t)
            plan_rows = []
            for c in cases:
                ends = {"value": keys}
                for end, (forced, means) in c["ends"].items():
                    ends[end], t = set_jobs(rs, forced, means, a.sens_cap)
                    todo.update(t)
                plan_rows.append((c, ends))
            plans[rs.id] = plan_rows
        runner.run(todo)
        for r in results:
            for c, ends in plans.get(r.rs.id, []):
                summ = {end: assemble(r.rs, keys, runner).summary() for end, keys in ends.items()}
                spread = {f: (max(v) - min(v)) if len(v := [s[f] for s in summ.values() if s[f] is not None]) > 1
                          else None for f in FIGURES}
                r.sensitivity.append({"field": c["field"], "value": c["value"], "low": c["low"], "high": c["high"],
                                      "median_abs_error": summ, "spread": spread})
    figs = print_report(results, a.points)
    if a.write_error_table:
        table = error_table(results, a.folder)
        tmp = Path(a.write_error_table + ".tmp")
        tmp.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(a.write_error_table)
        print(f"error table: {table['points']} points, {len(table['cells'])} cells → {a.write_error_table}")
    dt = time.perf_counter() - t0
    print(f"\n{len(sets)} sets, {sum(len(r.points) for r in results)} points in {dt:.1f} s")
    if a.json:
        text = json.dumps(to_json(results, figs, dt), indent=1)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
