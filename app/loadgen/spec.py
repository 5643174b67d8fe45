"""RampSpec: what a ramp does — levels, step length, request shape, SLO, stop rules.

Units: seconds for every time, tokens for lengths, requests/s for rates, fractions
(0–1) for failure rates. Validation errors name the field and say what is allowed.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# the workload's vocabulary, re-exported: a ramp's request shape is app.loadgen.workload's
from app.loadgen.workload import (Length, MultiTurn, SharedPrefix, Workload, parse_length, parse_multi_turn,
                                  parse_shared_prefix)
from app.settings import DEFAULT_MAX_FAILURE_RATE

__all__ = ["CapacitySearch", "ENDPOINTS", "Length", "MultiTurn", "RampSpec", "SLO", "SharedPrefix", "parse_length",
           "parse_multi_turn", "parse_shared_prefix", "slo_to_wall", "spec_to_wall"]

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


#: the failure-rate bound of an SLO that sets latency bounds and none for failures
#: (a fraction): failed requests count against an SLO — a level that failed more than 1 %
#: of its measured requests does not meet it, however fast the rest were (issue 15, item 11)
DEFAULT_FAILURE_RATE = 0.01


class SLO(BaseModel):
    """Service-level objective; any subset of the three p99 bounds (seconds), a
    failure-rate bound (fraction of a level's admitted measured requests, 0–1) and a
    rejection-rate bound (fraction of its measured requests the server refused with HTTP
    503: vLLM's admission control, app.engine.admission).

    Broken at a level when that level's p99 exceeds a bound, its rejection rate exceeds
    ``rejection_rate`` or its failure rate exceeds :attr:`failure_bound` (``failure_rate``, or :data:`DEFAULT_FAILURE_RATE` when only
    latency bounds are set); a request "meets" the SLO (for goodput) when it succeeded and
    its own TTFT, TPOT and e2e are within every bound set.
    """

    model_config = ConfigDict(extra="forbid")
    ttft_p99: Optional[float] = Field(None, gt=0, description="TTFT p99 bound, s")
    tpot_p99: Optional[float] = Field(None, gt=0, description="TPOT p99 bound, s per token")
    e2e_p99: Optional[float] = Field(None, gt=0, description="end-to-end latency p99 bound, s")
    ttfa_p99: Optional[float] = Field(None, gt=0, description=(
        "time-to-first-answer-token p99 bound (after a reasoning model's reasoning), s"))
    failure_rate: Optional[float] = Field(None, ge=0, le=1, description="failure-rate bound, fraction 0–1")
    rejection_rate: Optional[float] = Field(None, ge=0, le=1, description=(
        "bound on the fraction of requests the server refused with HTTP 503 (admission control), 0–1"))

    def is_empty(self) -> bool:
        return (self.ttft_p99 is None and self.tpot_p99 is None and self.e2e_p99 is None and self.failure_rate is None
                and self.rejection_rate is None and self.ttfa_p99 is None)

    @property
    def failure_bound(self) -> float | None:
        """The failure-rate bound a level is judged with (fraction): ``failure_rate`` when
        set, :data:`DEFAULT_FAILURE_RATE` when the SLO sets latency bounds only, None for
        an empty SLO (nothing is judged)."""
        if self.failure_rate is not None:
            return self.failure_rate
        return None if self.is_empty() else DEFAULT_FAILURE_RATE


#: a search from a prediction probes up or down by this factor until the SLO's crossing is
#: bracketed: 25 % covers the planner's median TTFT/TPOT error against published GPU runs
#: (app/planner/data/model_error.json: 19–40 % on the fit sets, issue 34's closing note) in
#: one step, and 19 → 23 users at the demo, where doubling probed 38
PLAN_GROWTH = 1.25


class CapacitySearch(BaseModel):
    """How a capacity search probes. ``start``: the first level (1, or the planner's
    predicted users at SLO); ``max_level``: the highest level it may probe;
    ``resolution``: stop when the bracket is within this fraction of ``lo``;
    ``min_step``: … or within this many users (req/s in rate mode; None → 1 user or
    0.1 req/s); ``repeat``: how many times the whole search runs; ``growth``: the factor
    each probe multiplies (up) or divides (down) the level by until the SLO's crossing is
    bracketed — 2 (doubling from 1) for a search that knows nothing, :data:`PLAN_GROWTH`
    for one that starts at the planner's prediction (:meth:`from_prediction`, issue 37:
    the prediction is bracketed by its neighbours, not by twice it)."""

    model_config = ConfigDict(extra="forbid")
    start: float = Field(1.0, gt=0)
    max_level: float = Field(1024.0, gt=0)
    resolution: float = Field(0.10, ge=0, lt=1)
    min_step: Optional[float] = Field(None, gt=0)
    repeat: int = Field(1, ge=1, le=20)
    growth: float = Field(2.0, gt=1, le=16)

    @classmethod
    def from_prediction(cls, users: float, max_level: float = 1024.0, **kw: Any) -> "CapacitySearch":
        """The search that starts at a predicted capacity ``users`` (the planner's
        predicted users at the SLO, or a tune's measured users) and brackets it by
        :data:`PLAN_GROWTH` — the window's Run ramp (the tuner keeps doubling from its prediction)."""
        start = max(1.0, min(float(max_level), math.floor(users)))
        return cls(start=start, max_level=max_level, growth=kw.pop("growth", PLAN_GROWTH), **kw)

    def step(self, mode: str) -> float:
        if self.min_step is not None:
            return self.min_step
        return 1.0 if mode == "concurrency" else 0.1


class RampSpec(Workload):
    """A load ramp: a :class:`app.loadgen.workload.Workload` (its request shape: lengths,
    dataset, shared prefix, multi-turn, arrivals — inherited, so its keys sit flat in the
    JSON and the profile YAML as they always did) and how it is run.

    Levels: ``levels`` (explicit) or ``max_level`` (geometric 1, 2, 4 … up to it, with
    ``max_level`` itself last). In ``concurrency`` mode a level is the number of
    requests kept in flight (closed loop, integer ≥ 1); in ``rate`` mode it is an
    arrival rate in requests/s (> 0), optionally capped at ``max_concurrency``: requests
    arrive with gamma-distributed gaps of shape ``burstiness`` (1: a Poisson process; the
    rule of ``vllm bench serve --burstiness``, :mod:`app.loadgen.arrivals`).

    Each level runs ``warmup_seconds`` (excluded from statistics) and then until
    ``step_seconds`` have passed and/or ``requests_per_level`` measured requests were
    sent — whichever comes first when both are set; then it drains its in-flight
    requests (bounded by ``request_timeout``).

    Stop rules: a level is aborted, and the ramp stopped, when its failure rate passes
    ``max_failure_rate`` (after at least ``min_requests_for_abort`` finished); the ramp
    stops after a level that breaks the ``slo``; ``max_total_seconds`` caps the ramp.
    Knee rule: :func:`app.loadgen.stats.find_knee` with ``knee_gain`` and
    ``knee_ttft_ratio``.

    Capacity search (``search`` set): the levels are chosen as the ramp goes
    (:func:`app.loadgen.capacity.next_level`) — a level that breaks the SLO or passes
    the failure rate does not stop it; ``requests_per_level`` is then the floor of
    measured requests each level is judged on and ``step_seconds`` its time cap, and a
    level measures only once each of its users has finished one request (``settle``).
    """

    model_config = ConfigDict(extra="forbid")

    url: str = "http://127.0.0.1:8000"
    endpoint: Literal["/v1/completions", "/v1/chat/completions"] = "/v1/completions"
    model: Optional[str] = Field(None, description="served model name; None → the first one /v1/models lists")
    mode: Literal["concurrency", "rate"] = "concurrency"
    levels: Optional[list[float]] = None
    max_level: Optional[int] = Field(None, ge=1)
    step_seconds: Optional[float] = Field(20.0, gt=0)
    requests_per_level: Optional[int] = Field(None, ge=1)
    warmup_seconds: float = Field(0.0, ge=0)
    ignore_eos: bool = True
    temperature: float = Field(0.0, ge=0)
    request_timeout: float = Field(300.0, gt=0)
    max_failure_rate: float = Field(DEFAULT_MAX_FAILURE_RATE, ge=0, le=1, description=(
        "a level whose failed requests pass this fraction (0–1) is aborted and the ramp stopped; the run "
        "controller sets it from the user's Settings (app.run.safety)"))
    min_requests_for_abort: int = Field(5, ge=1)
    slo: SLO = Field(default_factory=SLO)
    max_total_seconds: Optional[float] = Field(None, gt=0)
    knee_gain: float = Field(0.15, ge=0, description="knee: throughput growth per doubling below this")
    knee_ttft_ratio: float = Field(1.5, ge=1, description="knee: TTFT p99 growth at least this")
    search: Optional[CapacitySearch] = Field(None, description="find the capacity instead of running fixed levels")
    rejected_wait_s: float = Field(1.0, gt=0, description=(
        "closed loop: seconds a user whose request the server refused (HTTP 503) waits before it sends it "
        "again, when the answer has no Retry-After and the workload no think time (vLLM sends none)"))
    settle: Optional[bool] = Field(None, description=(
        "closed loop: a level's warm-up lasts until each user has finished one request (at least "
        "warmup_seconds); None → on for a capacity search, off for fixed levels"))

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url {v!r}: write the server's base URL, e.g. http://127.0.0.1:8000")
        if v.endswith("/v1"):
            v = v[:-3]
        return v

    @model_validator(mode="after")
    def _check(self) -> "RampSpec":
        if self.search is not None:
            # the levels come from the search as it goes (app.loadgen.capacity.next_level)
            if self.mode == "concurrency" and (self.search.start != int(self.search.start)
                                               or self.search.max_level != int(self.search.max_level)):
                raise ValueError("search: a concurrency search starts and ends at whole numbers of users")
            if self.search.start > self.search.max_level:
                raise ValueError(f"search: start {self.search.start:g} is above max_level {self.search.max_level:g}")
            self.levels = []
        elif self.levels is None:
            if self.max_level is None:
                raise ValueError("no levels: give levels (e.g. [1, 2, 4, 8]) or max_level (geometric 1, 2, 4 … N)")
            n, lv = 1, []
            while n < self.max_level:
                lv.append(float(n))
                n *= 2
            lv.append(float(self.max_level))
            self.levels = lv
        if not self.levels and self.search is None:
            raise ValueError("levels is empty: give at least one level")
        for x in self.levels:
            if self.mode == "concurrency" and (x < 1 or x != int(x)):
                raise ValueError(f"level {x}: a concurrency level is a whole number ≥ 1")
            if self.mode == "rate" and not x > 0:
                raise ValueError(f"level {x}: a rate level is a request rate > 0 req/s")
        if self.step_seconds is None and self.requests_per_level is None:
            raise ValueError("set step_seconds and/or requests_per_level: a level needs an end")
        self.check_kinds(self.mode)
        return self

    @property
    def retry_wait_s(self) -> float:
        """Seconds a refused user (HTTP 503 without ``Retry-After``) waits before it sends
        its request again: the multi-turn think time (its mean) when there is one, else
        ``rejected_wait_s`` (issue 38: Retry-After, else the think time, else 1 s)."""
        mt = self.multi_turn
        return mt.think_s if mt is not None and mt.think_s > 0 else self.rejected_wait_s

    @property
    def settles(self) -> bool:
        """Whether a closed-loop level waits for each user's first request to finish before
        it measures (``settle``; by default only a capacity search does)."""
        return self.search is not None if self.settle is None else self.settle

    def level_quota(self, level: float) -> int | None:
        """The measured requests a level sends before it stops (None: time only):
        ``requests_per_level``; in a concurrency search at least twice the level's users
        — a search judges a level at full load, and with fewer requests than twice its
        users most would run while the level drains."""
        quota = self.requests_per_level
        if quota is not None and self.search is not None and self.mode == "concurrency":
            quota = max(quota, 2 * int(level))
        return quota

    @property
    def shape(self) -> str:
        """The request shape in words, recorded with every result: ``prompt 384–640,
        output 96–160 tokens (uniform, seed 0)``, ``… (fixed)`` or ``prompts from FILE``."""
        def one(name: str) -> str:
            lo, hi = self.length_range(name)
            return f"{lo}" if lo == hi else f"{lo}–{hi}"

        fixed = all(lo == hi for lo, hi in (self.length_range("prompt_tokens"), self.length_range("output_tokens")))
        how = "fixed" if fixed else f"uniform, seed {self.seed}"
        if self.prompts_file is not None:
            try:
                ds = self.dataset()  # a Dataset: prompts_file is set
                answers = ds is not None and ds.has_answers
            except ValueError:
                answers = False
            if answers:  # app.loadgen.prompts.LengthSampler: the answers' lengths, capped
                cap = f" (≤ {self.output_cap} tokens)" if self.output_cap is not None else ""
                return f"prompts from {self.prompts_name}, output from its answers{cap} (sampled, seed {self.seed})"
            return (f"prompts from {self.prompts_name} (sampled, seed {self.seed}), "
                    f"output {one('output_tokens')} tokens ({how})")
        return f"prompt {one('prompt_tokens')}, output {one('output_tokens')} tokens ({how})" + self.kinds_shape()

    @property
    def largest_level(self) -> int:
        """The most requests ever in flight (concurrency) or the cap (rate; 1024 if none)."""
        if self.search is not None:
            top = self.search.max_level
            return int(top) if self.mode == "concurrency" else (self.max_concurrency or 1024)
        if self.mode == "concurrency":
            return int(max(self.level_values))
        return self.max_concurrency or 1024

    @property
    def level_values(self) -> list[float]:
        """``levels`` as validation leaves them: never None (``max_level``'s, or [] for a search)."""
        if self.levels is None:
            raise ValueError("a RampSpec built without validation has no levels")
        return self.levels

    @property
    def chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    @property
    def planned_seconds(self) -> float | None:
        """How long the ramp runs if no level stops early: levels × (warm-up + step), s,
        capped by ``max_total_seconds``; the drain of in-flight requests at each level's
        end comes on top. None when levels end by request count (``step_seconds`` None)
        or a capacity search chooses them (``search``): then the cap, if any."""
        if self.step_seconds is None or self.search is not None:
            return self.max_total_seconds
        total = len(self.level_values) * (self.warmup_seconds + self.step_seconds)
        return min(total, self.max_total_seconds) if self.max_total_seconds else total


def slo_to_wall(slo: SLO, k: float) -> SLO:
    """An SLO written in rig seconds → wall seconds for a sim running ``k``× faster than
    the wall clock (every bound ÷ k; docs/design.md "Sim time"). ``k == 1`` returns
    ``slo`` unchanged. Raises ValueError for ``k`` ≤ 0."""
    if not k > 0:
        raise ValueError(f"time scale {k}: a sim's time scale is > 0")
    if k == 1.0:
        return slo
    return slo.model_copy(update={f: getattr(slo, f) / k for f in ("ttft_p99", "tpot_p99", "e2e_p99", "ttfa_p99")
                                  if getattr(slo, f) is not None})


def spec_to_wall(spec: RampSpec, k: float, *, durations: bool = True) -> RampSpec:
    """A RampSpec written in rig seconds → the one the load generator runs against a sim
    ``k``× faster than the wall clock: the SLO bounds ÷ k (:func:`slo_to_wall`) and, with
    ``durations``, ``step_seconds``, ``warmup_seconds``, ``request_timeout`` and
    ``max_total_seconds`` ÷ k too (every front end writes its spec in rig seconds; the run
    controller converts it). In rate mode the levels, and a search's levels, × k: they are
    requests per rig second. ``k == 1`` returns ``spec`` unchanged."""
    if k == 1.0:
        return spec
    upd: dict = {"slo": slo_to_wall(spec.slo, k)}
    if spec.mode == "rate":  # a rig rate of r req/s is r·k req/s of wall time
        upd["levels"] = [x * k for x in spec.level_values]
        if spec.search is not None:
            sr = spec.search
            upd["search"] = sr.model_copy(update={"start": sr.start * k, "max_level": sr.max_level * k,
                                                  "min_step": sr.step("rate") * k})
    if durations:
        upd.update(warmup_seconds=spec.warmup_seconds / k, request_timeout=spec.request_timeout / k,
                   rejected_wait_s=spec.rejected_wait_s / k)
        for f in ("step_seconds", "max_total_seconds"):
            if getattr(spec, f) is not None:
                upd[f] = getattr(spec, f) / k
        if spec.multi_turn is not None and spec.multi_turn.think_s:
            upd["multi_turn"] = spec.multi_turn.model_copy(update={"think_s": spec.multi_turn.think_s / k})
    return spec.model_copy(update=upd)
