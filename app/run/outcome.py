"""What a ramp produced, assembled: :class:`RampOutcome`, the verdict and the energy.

The run controller (:mod:`app.run.controller`) sequences a ramp; what its end reports is
put together here — the outcome's fields and statuses, users at the SLO and the
one-sentence verdict (:func:`ramp_verdict`: the rig, the server's options, what the
server and cards showed where the SLO broke, J/token, the prices from Settings) and a
level's power and J/token (:func:`ramp_energy`, the one definition in
:func:`app.telemetry.derived.level_energy`). Figures are in rig seconds.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from app.engines import Engine
from app.loadgen.capacity import Capacity, capacity_of
from app.loadgen.spec import CapacitySearch, RampSpec
from app.loadgen.stats import Knee, StepStats, records_to_rig
from app.profiles.model import HardwareFingerprint, ResultsSummary
from app.run.hardware import hardware_for
from app.run.record import RecordSpec, RunRecorder
from app.run.target import LaunchTarget
from app.run.verdict import Verdict, build_verdict, is_indicative, model_label, observe, verdict_sentence
from app.server.supervisor import Supervisor
from app.settings import load_settings
from app.telemetry import names
from app.telemetry.derived import LevelEnergy, gpu_series, level_energy
from app.telemetry.series import SeriesBank

log = logging.getLogger(__name__)

#: statuses of a ramp that ran to an orderly end
OK_STATUSES = ("done", "slo_broken", "stopped")

#: seconds between tries to save a finished run the store refused (a full disk)
SAVE_RETRY_S = 5.0


@dataclass
class RampOutcome:
    """What a ramp produced, in rig seconds.

    ``status``: ``done``, ``slo_broken``, ``failed`` (failure-rate stop), ``stopped``
    (total-duration cap), ``safety`` (thermal stop), ``aborted``, ``server_failed`` or
    ``error`` (nothing ran: ``error`` holds the message). ``stop_reason``: one line for
    humans. ``run_id``: the recorded run (None when not recorded, or not saved yet).
    ``unsaved``: why the run is not (completely) in the run store yet — a full disk, a
    read-only home: the path and the cause; the controller saves it when it can
    (:meth:`RunController.save_pending`). ``records``: every
    request (session-clock seconds, wall). ``capacity``: users at the SLO from the levels
    (a capacity search's answer, or the ramp's levels judged the same way);
    ``verdict``: the one-sentence answer with the rig, flags, cost and limit."""

    status: str
    stop_reason: str = ""
    error: str | None = None
    model: str | None = None
    steps: list[StepStats] = field(default_factory=list)
    knee: Knee | None = None
    run_id: int | None = None
    results: ResultsSummary | None = None
    summary: dict[str, Any] | None = None
    records: list = field(default_factory=list)
    time_scale: float = 1.0
    capacity: Capacity | None = None
    verdict: Verdict | None = None
    unsaved: str | None = None

    @property
    def ok(self) -> bool:
        """True when the ramp ran to an orderly end (all levels, an SLO stop or its cap)."""
        return self.status in OK_STATUSES


@dataclass
class VerdictContext:
    """What the verdict of a ramp reads of the session: the launch ``target`` (None:
    none), the sim's ``time_scale`` k and ``/sim/info`` (``sim_info``, empty: not a sim),
    the recorded ``hardware`` (None: read it now), the local ``supervisor`` (None: none),
    the server's ``url`` and ``api_model``, the telemetry ``bank`` and the planner's
    ``plan`` (``Plan.as_dict()``; None: not planned)."""

    target: LaunchTarget | None
    time_scale: float = 1.0
    sim_info: dict[str, Any] = field(default_factory=dict)
    hardware: HardwareFingerprint | None = None
    supervisor: Supervisor | None = None
    url: str | None = None
    api_model: str | None = None
    bank: SeriesBank | None = None
    plan: dict[str, Any] | None = None


def ramp_energy(bank: SeriesBank, st: StepStats, time_scale: float = 1.0) -> LevelEnergy:
    """Power (W) and J/token of level ``st`` (rig seconds) from the GPU power samples in
    ``bank`` (:func:`app.telemetry.derived.level_energy`; ``time_scale``: the sim's k)."""
    power = gpu_series(bank, names.POWER_W)
    return level_energy(power, st.window_start, st.window_end, st.output_tps * st.window_s, time_scale)


def ramp_verdict(spec: RampSpec, steps: list[StepStats], records: list[Any], ctx: VerdictContext,
                 served: str | None = None) -> tuple[Capacity, Verdict]:
    """Users at the SLO (:func:`app.loadgen.capacity.capacity_of`: a search's answer, or
    the ramp's levels judged alike) and the verdict: the rig, the server's options,
    what the server and cards showed at the level that broke the SLO, J/token at the
    capacity level and the prices from Settings. ``spec``: the ramp (rig seconds);
    ``steps``: its levels (rig seconds); ``records``: its requests (wall, session clock);
    ``served``: the model name the load generator found (an attached server's)."""
    k = ctx.time_scale
    search = spec.search or CapacitySearch(start=min(s.level for s in steps), max_level=max(s.level for s in steps))
    cap = capacity_of(steps, records_to_rig(records, k), spec.slo, search, spec.mode,
                      {s.idx: s.repeat for s in steps}, seed=spec.seed)
    cap.shape = spec.shape
    t = ctx.target
    engine = t.engine if t is not None else Engine.ATTACH
    measured = Engine.SIM if ctx.sim_info else engine  # an attached sim: its rig's cards
    hw = ctx.hardware
    if hw is None and measured.planned:  # not recorded: read it now
        try:
            hw = hardware_for(measured, supervisor=ctx.supervisor, info=ctx.sim_info,
                              gpus=t.config.gpus if t is not None else None)
        except Exception:
            log.exception("could not read the hardware for the verdict")
    if hw is not None:
        rig = hw.cards_text() + (" (sim)" if engine.simulated or ctx.sim_info else "")
        gpus = hw.count
    else:
        rig, gpus = f"the server at {ctx.url}", 1
    config = t.config.model_dump() if t is not None and engine.launches else None
    if config is not None:
        gpus = max(gpus if hw is not None else 1,
                   (config.get("tensor_parallel_size") or 1) * (config.get("pipeline_parallel_size") or 1))
    best = next((s for s in steps if s.level == cap.users), None)
    nxt = next((s for s in steps if s.level == cap.next_users), None)
    jpt = ramp_energy(ctx.bank, best, k).j_per_token if best is not None and ctx.bank is not None else None
    obs = observe(ctx.bank, nxt, k) if nxt is not None and ctx.bank is not None else None
    (p_lo, p_hi), (o_lo, o_hi) = spec.length_range("prompt_tokens"), spec.length_range("output_tokens")
    prices = load_settings().pricing
    model = (model_label(t.config.model) if t is not None and config is not None
             else (ctx.api_model or served or "the model"))
    verdict = build_verdict(cap, steps, rig=rig, model=model, gpus=gpus, config=config, observation=obs,
                            j_per_token=jpt, pricing=prices, plan=ctx.plan,
                            mean_tokens=(p_lo + p_hi + o_lo + o_hi) / 2, has_slo=not spec.slo.is_empty())
    if is_indicative(spec, cap) and verdict.users is not None:
        verdict.indicative = True
        verdict.sentence = verdict_sentence(verdict)
    return cap, verdict


class UnsavedRuns:
    """Finished runs the store could not take yet (a full disk, a read-only home), kept in
    memory and retried every :data:`SAVE_RETRY_S` s on a background thread until
    :attr:`closing` is set; ``on_saved(run_id)`` for each one saved (that thread, or the
    caller of :meth:`save`). ``runs``: those still unsaved."""

    def __init__(self, on_saved: Callable[[int | None], None]) -> None:
        self.runs: list[RunRecorder] = []
        self.closing = threading.Event()
        self._on_saved = on_saved
        self._outcomes: dict[int, RampOutcome] = {}  # id(recorder) → the outcome that reported it unsaved
        self._saver: threading.Thread | None = None
        self._lock = threading.Lock()

    def keep(self, rec: RunRecorder, outcome: RampOutcome | None = None) -> str:
        """A finished run the store refused (part of): kept, retried in the background
        (``outcome``'s ``run_id`` is set and ``unsaved`` cleared once it is saved);
        returns the message for the user (the path, the cause, what happens next)."""
        with self._lock:
            if rec not in self.runs:
                self.runs.append(rec)
            if outcome is not None:
                self._outcomes[id(rec)] = outcome
            if not self.closing.is_set() and (self._saver is None or not self._saver.is_alive()):
                self._saver = threading.Thread(target=self._loop, name="run-saver", daemon=True)
                self._saver.start()
        return (f"{rec.problem}. The results are kept in memory (shown here; export them to another disk if "
                f"you need them now) and the run is saved as soon as the store can be written again")

    def _loop(self) -> None:
        while self.runs and not self.closing.wait(SAVE_RETRY_S):
            self.save()

    def save(self) -> list[RunRecorder]:
        """Try to write every run kept so far; each one saved is announced. Returns those
        still unsaved."""
        with self._lock:
            todo = list(self.runs)
        for rec in todo:
            try:
                ok = rec.save_pending()
            except Exception:
                log.exception("saving run %s failed", rec.run_id)
                ok = False
            if ok:
                with self._lock:
                    if rec in self.runs:
                        self.runs.remove(rec)
                    out = self._outcomes.pop(id(rec), None)
                if out is not None:
                    out.run_id, out.unsaved = rec.run_id, None
                self._on_saved(rec.run_id)
        with self._lock:
            return list(self.runs)


def record_outcome(rec: RunRecorder, out: RampOutcome, record: RecordSpec | None, pending: UnsavedRuns,
                   emit: Callable[..., None]) -> None:
    """Finish the run ``rec`` a ramp opened with its outcome ``out`` (its summary and
    results into ``out``; ``out.run_id`` once saved, else ``out.unsaved`` and the run kept
    in ``pending``); a ramp of ``vllm-dyno ramp`` that ran nothing (a failed pre-flight
    check: no profile, no request) is discarded. ``emit(name, *args)``: the listener's
    ``on_record_failed``. Never raises."""
    try:
        if out.status == "error" and not out.records and not out.steps and record is not None \
                and record.profile is None:
            rec.discard()  # nothing ran (`vllm-dyno ramp`'s failed pre-flight check): no run
            return
        out.summary, out.results = rec.finish(out.status, out.stop_reason, out.knee, error=out.error,
                                              verdict=out.verdict, users_at_slo=out.capacity)
        if rec.saved:
            out.run_id = rec.run_id
        else:
            out.unsaved = rec.problem
            emit("on_record_failed", pending.keep(rec, out))
    except Exception as e:
        log.exception("could not complete run %s", rec.run_id)
        emit("on_record_failed", f"run {rec.run_id} could not be completed in the store: {e}")
