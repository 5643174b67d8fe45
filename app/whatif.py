"""Four cards or eight? — a measured run's verdict predicted on other counts or kinds of cards.

From a recorded run (its model and server options, its cards, its ramp and SLO, its
measured levels) the what-if predicts the users at the run's SLO for the same model on
other cards — ``8× RTX 5090`` for a run on ``4× RTX 5090``, ``8× RTX 5090`` for a run on
``8× RTX 4090`` — with the output tokens/s at that SLO, scaling efficiency and cost per
million output tokens side by side (issue 17 item 5).

How, one mechanism each:

- the measured row: users at the SLO from the run's levels and requests
  (:func:`app.loadgen.capacity.capacity_of`, as the run controller judges them);
- the step-time parameters: those the planner uses for the cards — a calibration saved
  by ``vllm-dyno calibrate`` (:func:`app.planner.calibrate.load_calibration`), else the
  per-class defaults; a run on the simulated rig uses the sim's own (the defaults for
  vLLM 0.32's rules). Cards of another kind without a calibration of their own get the
  run's calibration as corrections: each fitted parameter × (calibrated ÷ default) of
  the run's cards, on the new card's defaults (assumed: the efficiencies and overheads
  carry over between cards of one host);
- the calibration's accuracy: the run's own ramp re-run on the step-level engine with
  those parameters, compared level by level (output tok/s, TTFT and TPOT p50);
- each prediction: the plan of the same options on the new cards (tensor parallelism over
  all of them; a data-parallel variant of the run's own layout when the count is a
  multiple of it; the planner's layout fix when a split does not fit) and the capacity
  search of the run's ramp on the step-level engine
  (:func:`app.planner.predict.predict_ramp`) — the rule ``vllm-dyno ramp --find-capacity``
  measures by;
- scaling efficiency = (output tok/s at the SLO ÷ the predicted same-hardware row's) ÷
  (cards ÷ its cards), as app.comparison defines it, so that the model's error on the
  measured cards cancels; cost = :func:`app.telemetry.derived.cost_per_mtok` with the
  prices from Settings (rented; energy only where power was measured).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from app.config import ServerConfig
from app.engine.steptime import PerfParams, default_params
from app.engines import Engine
from app.loadgen.capacity import P99_MIN_REQUESTS, SEARCH_STEP_CAP_S, Capacity, capacity_of, slo_text
from app.loadgen.records import RequestRecord
from app.loadgen.spec import SLO, CapacitySearch, RampSpec
from app.loadgen.stats import StepStats, records_to_rig
from app.planner.calibrate import FIT_DEFAULT, hardware_fingerprint, load_calibration
from app.planner.gpus import GpuSpec
from app.planner.model_error import statement_for_plan
from app.planner.models import resolve_model
from app.planner.plan import Plan, apply_fix, build_step_model, fix_to_flags, plan
from app.planner.predict import predict_ramp
from app.profiles.io import ProfileError, profile_from_data
from app.profiles.model import HardwareFingerprint
from app.settings import Pricing
from app.telemetry.derived import cost_per_mtok

class WhatIfError(ValueError):
    """A run the what-if cannot use, or a target it cannot plan; the message names the
    run or the input and the fix."""


@dataclass
class LevelAccuracy:
    """One measured level against the engine's prediction of it (same ramp, same
    parameters): output tokens/s and the TTFT/TPOT medians (s); errors in % of the
    measurement (None where either side has no figure)."""

    users: float
    measured_tps: float
    predicted_tps: float
    tps_error_pct: float | None
    ttft_p50_error_pct: float | None
    tpot_p50_error_pct: float | None


@dataclass
class WhatIfRow:
    """One rig in the table. ``gpus`` cards the server uses; ``layout`` its parallel
    options (ServerConfig fields); ``measured`` the run itself; ``users`` at the SLO
    (``users_low``–``users_high`` its interval; None when it cannot run: ``problem`` the
    planner's error code and ``note`` why); ``output_tps`` at the users-at-SLO level;
    ``scaling_efficiency`` vs the predicted same-hardware row; costs per 10⁶ output
    tokens in the pricing's currency."""

    label: str
    gpu: str
    gpus: int
    layout: dict[str, int]
    measured: bool = False
    users: float | None = None
    users_low: float | None = None
    users_high: float | None = None
    next_users: float | None = None
    output_tps: float | None = None
    tps_per_gpu: float | None = None
    scaling_efficiency: float | None = None
    cost_per_mtok_rented: float | None = None
    cost_per_mtok_energy: float | None = None
    limited_by: str = ""
    problem: str | None = None
    note: str = ""
    #: the model's measured error against published GPU runs for this row's cards, load,
    #: layout and quantization (:mod:`app.planner.model_error`); "" for a measured row or
    #: the CPU build
    model_error: str = ""

    @property
    def layout_text(self) -> str:
        return layout_text(self.layout)


@dataclass
class WhatIf:
    """The what-if of run ``run_id``: ``rows`` (the measured run first, then its
    predicted twin on the same cards, then each target), the ``slo`` and request
    ``shape`` judged, the parameters' ``params_source``, ``accuracy`` per measured level
    and ``accuracy_pct`` (the largest output tok/s error over them, %)."""

    run_id: int
    model: str
    rig: str
    slo: dict[str, float]
    shape: str
    params_source: str
    accuracy: list[LevelAccuracy]
    rows: list[WhatIfRow] = field(default_factory=list)
    currency: str = "$"

    @property
    def accuracy_pct(self) -> float | None:
        errs = [abs(a.tps_error_pct) for a in self.accuracy if a.tps_error_pct is not None]
        return max(errs) if errs else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["accuracy_pct"] = self.accuracy_pct
        return d

    def table(self) -> str:
        """The rows as text (``vllm-dyno plan --from-run``)."""
        cur = self.currency
        acc = self.accuracy_pct
        lines = [f"What if — run #{self.run_id}: {self.model} on {self.rig} at {slo_text(self.slo)}",
                 f"  requests: {self.shape}; step-time parameters: {self.params_source}",
                 "  calibration accuracy on the run's own levels (the step-level engine vs measured): "
                 + ("output tok/s within ±" + f"{acc:.1f} %" if acc is not None else "no level to compare")
                 + f" over {len(self.accuracy)} level{'s' if len(self.accuracy) != 1 else ''}"]
        hdr = (f"  {'rig':<28} {'layout':<16} {'users':>6} {'range':>9} {'out tok/s':>10} {'tok/s/GPU':>10} "
               f"{'scaling':>8} {cur + '/M tok':>9}  limited by")
        lines += ["", hdr]
        for r in self.rows:
            rng = "" if r.users_low is None or r.users_low == r.users_high else f"{r.users_low:g}–{r.users_high:g}"
            cost = None
            if r.cost_per_mtok_rented is not None or r.cost_per_mtok_energy is not None:
                cost = (r.cost_per_mtok_rented or 0.0) + (r.cost_per_mtok_energy or 0.0)
            lines.append(f"  {r.label:<28} {r.layout_text:<16} {_f(r.users, 'g'):>6} {rng:>9} "
                         f"{_f(r.output_tps, ',.0f'):>10} {_f(r.tps_per_gpu, ',.1f'):>10} "
                         f"{_f(r.scaling_efficiency, '.2f'):>8} {_f(cost, ',.3f'):>9}  "
                         + (r.limited_by if r.problem is None else f"does not run: {r.problem}"))
            if r.note:
                lines.append(f"  {'':<28} {r.note}")
        errors = list(dict.fromkeys(r.model_error for r in self.rows if r.model_error))
        if errors:
            lines.append("")
            lines += [f"  {e}" for e in errors]
        lines.append("")
        lines.append("  scaling = (out tok/s ÷ the predicted same-cards row's) ÷ (GPUs ÷ its GPUs); cost from the "
                     "prices in Settings (rented; energy only where power was measured)")
        return "\n".join(lines)


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def layout_text(layout: dict[str, int]) -> str:
    """``{"tensor_parallel_size": 4, "data_parallel_size": 2}`` → ``TP 4 × DP 2``."""
    parts = [f"TP {layout.get('tensor_parallel_size', 1)}"]
    if layout.get("pipeline_parallel_size", 1) > 1:
        parts.append(f"PP {layout['pipeline_parallel_size']}")
    if layout.get("data_parallel_size", 1) > 1:
        parts.append(f"DP {layout['data_parallel_size']}")
    return " × ".join(parts)


def _layout(cfg: ServerConfig) -> dict[str, int]:
    return {"tensor_parallel_size": cfg.tensor_parallel_size or 1, "pipeline_parallel_size":
            cfg.pipeline_parallel_size or 1, "data_parallel_size": cfg.data_parallel_size or 1}


# ---------------------------------------------------------------------- the run
@dataclass
class RunInputs:
    """What the what-if reads from a recorded run: its options, cards, ramp (rig s), SLO,
    levels and requests (rig s), and the J/token of its recorded verdict."""

    run_id: int
    engine: Engine
    config: ServerConfig
    hardware: HardwareFingerprint
    spec: RampSpec
    slo: SLO
    steps: list[StepStats]
    records: list[RequestRecord]
    j_per_token: float | None = None


def read_run(store: Any, run_id: int, slo: SLO | None = None) -> RunInputs:
    """The inputs of ``run_id`` from ``store`` (an :class:`app.store.RunStore`); ``slo``
    replaces the run's own. Raises :class:`WhatIfError` naming the run and the fix."""
    run = store.get_run(run_id)
    if run is None:
        raise WhatIfError(f"no run {run_id} in {store.path} (vllm-dyno runs list shows the ids)")
    summary = run.get("summary") or {}
    hw = summary.get("hardware")
    if not hw:
        raise WhatIfError(f"run {run_id} recorded no cards (an attached server?): a what-if starts from a run "
                          "that vllm-dyno launched")
    data = (run.get("config") or {}).get("profile")
    if not data:
        raise WhatIfError(f"run {run_id} recorded no server options (profile) to plan with")
    try:
        profile = profile_from_data(data, f"run {run_id}")
        cfg = profile.server_config()
        spec = RampSpec.model_validate(run.get("spec") or {})
    except (ProfileError, ValueError) as e:
        raise WhatIfError(f"run {run_id}: its recorded settings do not read back ({e})") from None
    if spec.mode != "concurrency":
        raise WhatIfError(f"run {run_id} is a rate ramp: a what-if predicts concurrent users (a concurrency ramp "
                          "or vllm-dyno ramp --find-capacity)")
    slo = slo if slo is not None and not slo.is_empty() else spec.slo
    if slo.is_empty():
        raise WhatIfError(f"run {run_id} had no SLO: give one (--slo-ttft-p99 2 --slo-tpot-p99 0.1) to predict "
                          "the users at it")
    steps = [StepStats.model_validate(d) for d in store.levels(run_id)]
    if not steps:
        raise WhatIfError(f"run {run_id} has no completed level to start from")
    k = float(summary.get("time_scale") or 1.0)
    # a request stored before the store kept turns (layout v4) has turn None: none known
    records = records_to_rig([RequestRecord(**{**r, "turn": r["turn"] or 0}) for r in store.requests(run_id)], k)
    verdict = summary.get("verdict") or {}
    jpt = verdict.get("j_per_token") if SLO.model_validate(verdict.get("slo") or {}) == slo else None
    engine = Engine.parse(run.get("engine")) or Engine.VLLM
    return RunInputs(run_id, engine, cfg, HardwareFingerprint.model_validate(hw), spec, slo, steps, records, jpt)


def search_spec(spec: RampSpec, slo: SLO) -> RampSpec:
    """The capacity search the predictions run: the run's own when it was one, else one
    with its request shape and warm-up and ``vllm-dyno ramp --find-capacity``'s level
    floor and cap (:data:`~app.loadgen.capacity.P99_MIN_REQUESTS` requests,
    :data:`~app.loadgen.capacity.SEARCH_STEP_CAP_S` s)."""
    d = spec.model_dump(exclude={"levels", "max_level"})
    d["slo"] = slo.model_dump()
    if spec.search is None:
        d.update(search=CapacitySearch().model_dump(), requests_per_level=P99_MIN_REQUESTS,
                 step_seconds=SEARCH_STEP_CAP_S)
    return RampSpec.model_validate(d)


# ---------------------------------------------------------------------- parameters
def transfer_params(calibrated: PerfParams, default_from: PerfParams, default_to: PerfParams) -> PerfParams:
    """A calibration of one set of cards carried to another: each fitted parameter
    (:data:`app.planner.calibrate.FIT_DEFAULT`) × (calibrated ÷ default) of the first, on
    the second's defaults; the rest (all-reduce) the second's defaults."""
    vals = {n: getattr(default_to, n) * getattr(calibrated, n) / getattr(default_from, n) for n in FIT_DEFAULT
            if getattr(default_from, n)}
    return replace(default_to, **vals, source=f"{calibrated.source}, carried over from the run's cards")


def _defaults(p: Plan) -> PerfParams:
    m, e = p.model, p.effective
    return default_params(p.cards[0], e.tp, m.quant_bits if e.quantization else None)


# ---------------------------------------------------------------------- the what-if
def _cards(hw: HardwareFingerprint, gpu: str, count: int) -> list[GpuSpec]:
    same = gpu == hw.gpu
    fp = HardwareFingerprint(gpu=gpu, count=count, memory_gib=hw.memory_gib if same else None,
                             compute_capability=hw.compute_capability if same else None)
    return fp.planner_cards()


def what_if(store: Any, run_id: int, targets: Sequence[tuple[str | None, int | None]],
            pricing: Pricing | None = None, slo: SLO | None = None) -> WhatIf:
    """Predict run ``run_id``'s verdict on each target ``(card name, count)`` (None: the
    run's own) — see the module docstring. ``pricing``: Settings.pricing. Raises
    :class:`WhatIfError` for a run it cannot use or a card it does not know."""
    pricing = pricing or Pricing()
    ri = read_run(store, run_id, slo)
    hw, cfg = ri.hardware, ri.config
    # the engine's vLLM rules (the sim's own) or the run's version; a saved calibration unless it is the sim's
    defaults_only = not ri.engine.spec.calibrated
    version = ri.engine.plan_version(_version(hw))
    try:
        model = resolve_model(cfg.model)
        cards0 = hw.planner_cards()
    except (LookupError, ValueError) as e:
        raise WhatIfError(f"run {run_id}: {e}") from None
    # the parameters: the sim's own, or the planner's for the run's cards (a saved calibration)
    rig = hw.rig_layout()  # a rig of several hosts (issue 21): its link in the step times, its own calibration
    base = plan(cfg, cards0, model, vllm_version=version, use_calibration=False, predict=False, rig=rig)
    if base.perf is None:
        raise WhatIfError(f"run {run_id}: the planner finds its settings do not fit {hw.describe()} "
                          f"({base.problem}); nothing to predict from")
    calibration = None if defaults_only else load_calibration(hardware_fingerprint(base.cards, rig))
    run_params = calibration or base.perf.params
    source = (f"the {ri.engine.spec.short}'s (vLLM {version} defaults)" if defaults_only else
              f"{calibration.source} for {hardware_fingerprint(base.cards, rig)}" if calibration else
              f"{run_params.source} — not calibrated: vllm-dyno calibrate {run_id} fits them to this run")
    perf0 = build_step_model(base, run_params)
    # accuracy: the run's own levels again, in order, on the engine
    again = predict_ramp(perf0, base.engine_limits(), ri.spec.model_copy(update={"slo": ri.slo}),
                         [s.level for s in ri.steps]).steps
    acc = _accuracy(ri.steps, again)
    search = search_spec(ri.spec, ri.slo)
    wi = WhatIf(run_id, cfg.model, hw.cards_text() + (" (sim)" if ri.engine.simulated else ""), ri.slo.model_dump(
        exclude_none=True), search.shape, source, acc, currency=pricing.currency)
    # the measured row
    judge = ri.spec.search or CapacitySearch(start=min(s.level for s in ri.steps),
                                             max_level=max(s.level for s in ri.steps))
    cap = capacity_of(ri.steps, ri.records, ri.slo, judge, "concurrency", {s.idx: s.repeat for s in ri.steps},
                      seed=ri.spec.seed)
    gpus0 = len(base.cards)
    meas = _row(f"{hw.cards_text()} (measured #{run_id})", hw.gpu, gpus0, _layout(cfg), cap, pricing,
                ri.j_per_token)
    meas.measured = True
    if ri.spec.search is None:
        meas.note = (f"levels {', '.join(f'{s.level:g}' for s in ri.steps)} of a fixed ramp: the users lie in "
                     f"{cap.users:g}–{cap.next_users:g}" if cap.next_users is not None else "")
    twin = _predict(f"{hw.cards_text()} (predicted)", hw.gpu, cfg, cards0, model, version, run_params, search,
                    pricing, rig)
    wi.rows = [meas, twin]
    seen = {(hw.gpu, gpus0, tuple(_layout(cfg).items()))}
    world0 = (cfg.tensor_parallel_size or 1) * (cfg.pipeline_parallel_size or 1)
    for gpu, count in targets:
        gpu = gpu or hw.gpu
        count = count or hw.count
        try:
            cards = _cards(hw, gpu, count)
        except (LookupError, ValueError) as e:
            raise WhatIfError(f"--gpu {gpu!r}: {e}") from None
        pp = cfg.pipeline_parallel_size or 1
        variants = []
        if count % pp == 0:
            variants.append(cfg.model_copy(update={"tensor_parallel_size": count // pp, "data_parallel_size": None}))
        if count != world0 and count % world0 == 0 and (cfg.data_parallel_size or 1) * world0 != count:
            variants.append(cfg.model_copy(update={"data_parallel_size": count // world0}))
        if not variants:
            variants.append(cfg)
        for v in variants:
            key = (gpu, count, tuple(_layout(v).items()))
            if key in seen:
                continue
            seen.add(key)
            params = _params_for(cards, v.tensor_parallel_size or 1, calibration, base, defaults_only)
            wi.rows.append(_predict(f"{count}× {gpu} (predicted)", gpu, v, cards, model, version, params, search,
                                    pricing))
    for r in wi.rows:
        if not r.measured and r.output_tps is not None and twin.output_tps:
            r.scaling_efficiency = (r.output_tps / twin.output_tps) / (r.gpus / twin.gpus)
    return wi


def _version(hw: HardwareFingerprint) -> str | None:
    v = (hw.vllm_version or "").removeprefix("sim").strip()
    return v or None


def _params_for(cards: list[GpuSpec], tp: int, calibration: PerfParams | None, base: Plan,
                defaults_only: bool) -> PerfParams | None:
    """The parameters for ``cards`` at tensor parallel size ``tp``: the defaults for an
    engine without calibration (``defaults_only``: the sim's); a calibration of their own;
    the run's calibration carried over (:func:`transfer_params`); else None (the planner's
    defaults for them)."""
    if defaults_only:
        return None
    own = load_calibration(hardware_fingerprint(cards))
    if own is not None or calibration is None:
        return own
    qbits = base.model.quant_bits if base.effective.quantization else None
    return transfer_params(calibration, _defaults(base), default_params(cards[0], tp, qbits))


def _predict(label: str, gpu: str, cfg: ServerConfig, cards: list[GpuSpec], model: Any, version: str | None,
             params: PerfParams | None, search: RampSpec, pricing: Pricing, rig: Any = None) -> WhatIfRow:
    """One predicted row: the plan of ``cfg`` on ``cards`` (its first-ranked layout fix
    when the split itself has an error) and the search on the engine; ``rig``: the hosts
    the cards sit in (a RigLayout; None: one host)."""
    p = plan(cfg, cards, model, vllm_version=version, params=params, use_calibration=False, predict=False, rig=rig)
    note = ""
    if p.verdict == "error" and p.fix and set(p.fix) <= {"tensor_parallel_size", "pipeline_parallel_size",
                                                          "data_parallel_size"}:
        fixed = apply_fix(cfg, p.fix)
        note = f"{p.problem}: the planner's layout {fix_to_flags(p.fix)}"
        cfg, p = fixed, plan(fixed, cards, model, vllm_version=version, params=params, use_calibration=False,
                             predict=False, rig=rig)
    row = WhatIfRow(label, gpu, len(p.cards), _layout(cfg), note=note)
    if p.verdict == "error" or p.perf is None:
        row.problem = p.problem or "does_not_fit"
        row.note = (p.primary.message if p.primary else "the planner finds no KV cache room on these cards")
        return row
    cap = predict_ramp(p.perf, p.engine_limits(), search).capacity
    row = _row(label, gpu, len(p.cards), _layout(cfg), cap, pricing, None, note)
    err = statement_for_plan(p, float(cap.users) if cap.users > 0 else None)
    row.model_error = err.text if err is not None else ""
    return row


def _row(label: str, gpu: str, gpus: int, layout: dict[str, int], cap: Capacity, pricing: Pricing,
         j_per_token: float | None, note: str = "") -> WhatIfRow:
    tps = cap.output_tps if cap.users > 0 else None
    rented, energy = cost_per_mtok(tps, gpus, j_per_token, pricing)
    return WhatIfRow(label, gpu, gpus, layout, users=cap.users, users_low=cap.users_low, users_high=cap.users_high,
                     next_users=cap.next_users, output_tps=tps, tps_per_gpu=tps / gpus if tps else None,
                     cost_per_mtok_rented=rented, cost_per_mtok_energy=energy, limited_by=cap.limited_by, note=note)


def _pct(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return 100.0 * (pred - meas) / meas


def _accuracy(measured: Sequence[StepStats], predicted: Sequence[StepStats]) -> list[LevelAccuracy]:
    """Level by level (matched in order), the steady levels with requests on both sides;
    not a broken level the search stopped once its verdict was decided (stop reason
    ``decided`` with a bound broken, app.loadgen.capacity.level_decided): it ended on the
    first few requests over a bound, its start-up transient, where the prediction runs the
    level to its request floor (a met level is decided only after 40 % of its floor)."""
    out = []
    for m, p in zip(measured, predicted):
        if not (m.n_ok and p.n_ok and m.steady and p.steady and m.output_tps > 0):
            continue
        if m.stop_reason == "decided" and m.slo_broken:
            continue
        out.append(LevelAccuracy(m.level, m.output_tps, p.output_tps, _pct(p.output_tps, m.output_tps),
                                 _pct(p.ttft_p50, m.ttft_p50), _pct(p.tpot_p50, m.tpot_p50)))
    return out
