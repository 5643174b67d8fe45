"""How far the performance model is from real GPUs, stated where it predicts (issue 34, item 5).

The figures come from the library of published vLLM GPU runs
(``benchmarks/data/realgpu/*.yaml``): ``benchmarks/real_gpu_fidelity.py
--write-error-table`` predicts every point of it as ``vllm-dyno predict`` does (no saved
calibration), and :func:`build_table` groups the per-point errors into the table shipped
as package data, :data:`TABLE_PATH` (``tests/integration/test_model_error.py``
recomputes it from the library and fails when it is stale: change the engine, rerun the
command).

A cell of the table is a scope — one card (its catalog name), a card class
(:func:`card_class`) or every card — and a load regime (:data:`REGIMES`: concurrent
requests per engine, the benchmark's ``--max-concurrency``, or ``--num-prompts`` at an
unbounded rate, or the measured request rate × mean latency; ``None``: every load). Its
figures are the median |error| in % of output tok/s, mean TTFT and mean TPOT
((predicted − measured) / measured, per point, as the fidelity benchmark computes them),
over the points of every set (fitted and validation) and over the validation sets alone.

:func:`statement` answers "how sure is the model here?" for a card, a load, a world size
and a quantization: the narrowest cell with at least :data:`MIN_POINTS` points, and what
the library does not cover (a card of a class it has no run on, more cards than any run
used, a quantization method no run of the class used).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from app.planner.gpus import load_catalog
from app.planner.models import quant_format

#: the shipped table (package data, written by ``benchmarks/real_gpu_fidelity.py --write-error-table``)
TABLE_PATH = Path(__file__).resolve().parent / "data" / "model_error.json"

#: load regimes, concurrent requests per engine: (label, lowest, highest or None). Light load
#: is decode of a few sequences (weight reads dominate); 9–64 the batch the kernels grow into;
#: above 64 the scheduler's limits, prefill interference and KV pressure.
REGIMES: tuple[tuple[str, float, float | None], ...] = (("1–8", 0.0, 8.0), ("9–64", 8.0, 64.0), ("65+", 64.0, None))

#: the fewest points a cell needs to be stated (fewer: the next wider cell)
MIN_POINTS = 3

#: the figures of a cell, as the fidelity benchmark names them
FIGURES = ("tput", "ttft", "tpot")
FIGURE_LABELS = {"tput": "output tok/s", "ttft": "TTFT", "tpot": "TPOT"}

HBM, GDDR, CPU = "data-centre cards (HBM)", "workstation and consumer cards (GDDR, LPDDR)", "the CPU build"
ALL = "every card"


def card_class(name: str) -> str:
    """The class of card ``name`` (a GPU catalog name; "CPU" for the CPU build): :data:`HBM`
    with 1,500 GB/s of memory bandwidth or more and NVLink (the step-time model's own
    split of its defaults, app/engine/steptime.py ``default_params``: the RTX 5090's
    GDDR7 reaches 1,792 GB/s without it), else :data:`GDDR`. An unknown name is GDDR
    (what an unlisted consumer card is)."""
    if name.strip().lower() == "cpu":
        return CPU
    spec = load_catalog().get(name)
    if spec is None:
        return GDDR
    if spec.kind == "cpu":
        return CPU
    return HBM if spec.bandwidth_gbs >= 1500 and spec.nvlink_gbs > 0 else GDDR


def quant_family(method: str | None) -> str:
    """A quantization method as the table groups it: the kernel variants of one format
    together (``awq_marlin`` → ``awq``, ``gptq_marlin`` → ``gptq``); "none" for 16-bit."""
    if not method:
        return "none"
    m = (quant_format(method) or method).lower()
    for base in ("awq", "gptq", "fp8"):
        if m.startswith(base):
            return base
    return m


def regime_of(concurrency: float) -> str:
    """The :data:`REGIMES` label of ``concurrency`` concurrent requests per engine."""
    for label, lo, hi in REGIMES:
        if concurrency > lo and (hi is None or concurrency <= hi):
            return label
    return REGIMES[0][0]


def offered_concurrency(max_concurrency: float | None, request_rate: float | str | None, num_prompts: float,
                        request_throughput: float | None = None, mean_e2el_ms: float | None = None,
                        data_parallel_size: int = 1) -> float:
    """Concurrent requests per engine of a ``vllm bench serve`` run: ``--max-concurrency``
    (at most ``--num-prompts``); else ``--num-prompts`` when every request is sent at once
    (rate inf); else Little's law, requests/s × the mean end-to-end latency (ms; the
    measured request throughput where known, else the rate); ÷ DP; at least 1."""
    rate = math.inf if request_rate is None or str(request_rate) == "inf" else float(request_rate)
    if max_concurrency:
        c = min(float(max_concurrency), float(num_prompts))
    elif math.isinf(rate):
        c = float(num_prompts)
    elif mean_e2el_ms:
        c = float(request_throughput or rate) * float(mean_e2el_ms) / 1e3
    else:
        c = float(num_prompts)
    return max(1.0, c / max(1, data_parallel_size))


@dataclass(frozen=True)
class PointError:
    """One published point as the fidelity benchmark predicted it: its card, load
    (concurrent requests per engine), world size (cards of one engine × DP), quantization
    method as served (None: 16-bit; :func:`quant_family` groups it), the set's role and id, and its errors in % by figure (only the
    figures the point publishes)."""

    gpu: str
    concurrency: float
    world: int
    quantization: str | None
    role: str
    set_id: str
    errors: dict[str, float]


@dataclass(frozen=True)
class Cell:
    """The errors of one scope × regime: points, sets, and by figure the median |error| in %
    over all points and over the validation sets' points (None where no point has it)."""

    scope: str
    regime: str | None
    points: int
    sets: int
    validation_points: int
    median_abs: dict[str, float | None]
    validation_median_abs: dict[str, float | None]


def _median_abs(values: list[float]) -> float | None:
    return round(statistics.median(abs(v) for v in values), 1) if values else None


def _cell(scope: str, regime: str | None, pts: Sequence[PointError]) -> Cell:
    val = [p for p in pts if p.role == "validation"]
    return Cell(scope, regime, len(pts), len({p.set_id for p in pts}), len(val),
                {f: _median_abs([p.errors[f] for p in pts if f in p.errors]) for f in FIGURES},
                {f: _median_abs([p.errors[f] for p in val if f in p.errors]) for f in FIGURES})


def build_table(points: Iterable[PointError], library: str = "") -> dict[str, Any]:
    """The table's JSON: ``cells`` (every scope × regime with a point, and each scope over
    every load), ``coverage`` per class (cards, the largest world size, quantizations),
    ``points`` and ``library`` (what the figures were computed from), and the points
    themselves (``point_errors``: the cells are this function of them, which a unit test
    checks; the integration test recomputes the points from the library)."""
    pts = list(points)
    scopes: dict[str, list[PointError]] = {ALL: pts}
    for p in pts:
        scopes.setdefault(p.gpu, []).append(p)
        scopes.setdefault(card_class(p.gpu), []).append(p)
    cells = []
    for scope in sorted(scopes):
        group = scopes[scope]
        cells.append(_cell(scope, None, group))
        for label, _, _ in REGIMES:
            sub = [p for p in group if regime_of(p.concurrency) == label]
            if sub:
                cells.append(_cell(scope, label, sub))
    coverage: dict[str, Any] = {}
    for p in pts:
        c = coverage.setdefault(card_class(p.gpu), {"cards": set(), "max_world": 0, "quantizations": set()})
        c["cards"].add(p.gpu)
        c["max_world"] = max(c["max_world"], p.world)
        c["quantizations"].add(quant_family(p.quantization))
    return {"library": library, "points": len(pts), "sets": len({p.set_id for p in pts}),
            "regimes": [label for label, _, _ in REGIMES], "min_points": MIN_POINTS,
            "cells": [asdict(c) for c in cells],
            "coverage": {k: {"cards": sorted(v["cards"]), "max_world": v["max_world"],
                             "quantizations": sorted(v["quantizations"])} for k, v in sorted(coverage.items())},
            "point_errors": [asdict(p) for p in pts]}


@dataclass(frozen=True)
class ErrorTable:
    """The shipped table (:func:`load_table`)."""

    cells: dict[tuple[str, str | None], Cell]
    coverage: dict[str, dict[str, Any]]
    points: int
    sets: int
    library: str
    point_errors: tuple[PointError, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ErrorTable":
        cells = {}
        for c in data["cells"]:
            cell = Cell(**c)
            cells[(cell.scope, cell.regime)] = cell
        return cls(cells, data["coverage"], int(data["points"]), int(data["sets"]), str(data.get("library", "")),
                   tuple(PointError(**d) for d in data.get("point_errors", ())))


@lru_cache(maxsize=1)
def load_table(path: str = str(TABLE_PATH)) -> ErrorTable:
    """The table at ``path`` (default: the shipped one). Raises FileNotFoundError /
    ValueError naming the file when it is missing or not the table's JSON."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return ErrorTable.from_json(data)
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not the model's error table ({e}); rerun benchmarks/real_gpu_fidelity.py "
                         "--write-error-table") from None


@dataclass(frozen=True)
class ErrorStatement:
    """What the model's measured error is where it predicts: the cell used (None: the
    library covers nothing of this kind), whether it is the card's own, and what the
    library does not cover. ``text`` is the sentence the Plan, the what-if, the tuner and
    ``predict`` print."""

    gpu: str
    regime: str
    cell: Cell | None
    own_card: bool
    outside: tuple[str, ...] = field(default=())

    @property
    def covered(self) -> bool:
        return self.cell is not None and not self.outside

    @property
    def text(self) -> str:
        c = self.cell
        if c is None:
            return (f"model error unknown here: the library of published runs has no run on {self.gpu} or its class "
                    f"({card_class(self.gpu)})")
        figs = ", ".join(f"{FIGURE_LABELS[f]} ±{c.median_abs[f]:.0f} %" for f in FIGURES
                         if c.median_abs[f] is not None)
        where = self.gpu if self.own_card else f"{c.scope} (no {MIN_POINTS}+ published runs on {self.gpu} itself)"
        load = f"at {c.regime} concurrent requests" if c.regime else f"at any load (few runs at {self.regime})"
        s = (f"model error vs published runs (median |error|): {figs} — on {where} {load}, {c.points} run"
             f"{'s' if c.points != 1 else ''} in {c.sets} set{'s' if c.sets != 1 else ''}")
        if self.outside:
            s += "; outside what the library covers: " + "; ".join(self.outside)
        return s

    def as_dict(self) -> dict[str, Any]:
        c = self.cell
        return {"text": self.text, "gpu": self.gpu, "regime": self.regime, "covered": self.covered,
                "own_card": self.own_card, "outside": list(self.outside),
                "scope": c.scope if c else None, "cell_regime": c.regime if c else None,
                "points": c.points if c else 0, "sets": c.sets if c else 0,
                "median_abs_error_pct": dict(c.median_abs) if c else None,
                "validation_median_abs_error_pct": dict(c.validation_median_abs) if c else None}


def statement(gpu: str, concurrency: float, world: int = 1, quantization: str | None = None,
              table: ErrorTable | None = None) -> ErrorStatement:
    """The model's measured error for ``concurrency`` concurrent requests per engine on
    card ``gpu`` with ``world`` cards per engine × DP and ``quantization`` (None: 16-bit):
    the first cell with :data:`MIN_POINTS` points of card × regime, card, class ×
    regime, class (every card is the last resort only for a class with no run:
    then there is no statement)."""
    t = table or load_table()
    regime = regime_of(concurrency)
    cls = card_class(gpu)

    def ok(key: tuple[str, str | None]) -> Cell | None:
        c = t.cells.get(key)
        return c if c is not None and c.points >= MIN_POINTS else None

    cell, own = None, False
    for key, is_own in (((gpu, regime), True), ((gpu, None), True), ((cls, regime), False), ((cls, None), False)):
        cell = ok(key)
        if cell is not None:
            own = is_own
            break
    outside: list[str] = []
    cov = t.coverage.get(cls)
    if cov is None:
        cell = None
    else:
        if world > int(cov["max_world"]):
            outside.append(f"{world} cards (the most in a published run of the class: {cov['max_world']})")
        q = quant_family(quantization)
        if q not in cov["quantizations"]:
            outside.append(f"quantization {q} (published runs of the class: "
                           f"{', '.join(x for x in cov['quantizations'])})")
    return ErrorStatement(gpu, regime, cell, own, tuple(outside))


def statement_for_plan(p: Any, concurrency: float | None = None) -> ErrorStatement | None:
    """:func:`statement` for a plan (app.planner.plan.Plan): its first card, its world
    size × DP, its quantization, and the load — ``concurrency`` if given, else the
    predicted users at the SLO, else the workload's requests at once, per engine. None
    for the CPU build (its error is the e2e calibration test's, not the GPU library's)
    or without the table."""
    gpu = p.gpus[0]
    if gpu.kind == "cpu":
        return None
    dp = max(1, int(getattr(p, "dp", 1) or 1))
    if concurrency is None:
        if p.capacity is not None and p.capacity.users:
            concurrency = float(p.capacity.users)
        elif p.workload is not None:
            n, _ = p.concurrency_for(p.workload.prompt_tokens, p.workload.output_tokens)
            concurrency = float(n) * dp
        else:
            concurrency = float(p.effective.max_num_seqs) * dp
    try:
        return statement(gpu.name, concurrency / dp, p.effective.tp * p.effective.pp * dp, p.effective.quantization)
    except (FileNotFoundError, ValueError):
        return None
