"""The predicted ramp and the predicted users at the SLO: a load-generator ramp run on
the step-level engine instead of a server.

Every piece is the one the measurement uses, so the prediction and the simulated rig
share one engine and one set of rules (issue 17 item 4):

- the engine: :func:`app.engine.offline.run_level` on :class:`app.engine.scheduler.Scheduler`
  stepping with :meth:`app.engine.steptime.StepTimeModel.engine_step_time` — what the sim's
  server runs (app/sim/engine.py), without HTTP; its KV blocks, ``max_num_seqs`` and
  ``max_num_batched_tokens`` those of the plan (:class:`EngineLimits`);
- the requests: :class:`app.loadgen.prompts.LengthSampler` of the ramp — the ±25 % spread
  (or the fixed lengths, or the LOW-HIGH range) drawn with the ramp's seed in the order
  the requests are sent, one sampler for the whole ramp, as the load generator draws them;
- the arrival pattern and the level's shape: a request-rate level's arrivals drawn by
  :func:`app.loadgen.arrivals.arrival_times` (the generator's own rule and seed, capped
  at ``max_concurrency``); N closed-loop users starting together
  (their first requests :data:`SEND_GAP_S` apart, as the generator sends them), the
  ramp's warm-up (until each user has finished a request where the ramp settles, as a
  search does: ``RampSpec.settles``), ``RampSpec.level_quota`` measured requests or ``step_seconds``,
  then the drain (app/loadgen/runner.py);
- the workload: a shared-prefix ramp's prefixes chosen by
  :class:`app.loadgen.prompts.SharedPrefixes` (the generator's rule and seed) and a
  multi-turn ramp's conversations drawn as :class:`app.loadgen.prompts.RequestFactory`
  draws them (turn counts, history bounded by ``max_model_len``, think times), each
  request carrying block identities so the engine's prefix cache
  (``enable_prefix_caching``, :class:`EngineLimits`) skips the prefill of blocks cached
  before (:class:`RequestStream`);
- the figures: each level cut by :func:`app.loadgen.stats.level_window` and summarised by
  :func:`app.loadgen.stats.compute_step_stats` from the requests as
  :class:`~app.loadgen.records.RequestRecord` (TTFT from the send, TPOT, numpy
  percentiles);
- admission control: the server's ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``
  (:class:`app.engine.admission.AdmissionLimits`, in :class:`EngineLimits`) refuse a request
  as the sim's front end does; the refused request is recorded as the load generator records
  an HTTP 503 (status ``rejected``) and its user sends it again after
  :meth:`app.loadgen.spec.RampSpec.retry_wait_s` — so a queue cap bounds the requests
  waiting, and with them the TTFT, at the price of the refused fraction that
  ``--slo-rejection-rate`` bounds; ``--max-num-active-seqs`` caps the scheduler's running
  requests (:class:`app.engine.scheduler.Scheduler`);
- the search: :func:`app.loadgen.capacity.search_levels` (``next_level``), judged by
  :func:`~app.loadgen.capacity.level_met`, answered by :func:`~app.loadgen.capacity.capacity_of`.

Units: rig seconds, tokens, output tokens/s.
"""
from __future__ import annotations

import random
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from app.engine.admission import REJECTED_MESSAGES, AdmissionLimits
from app.engine.kvcache import KvCacheLayout
from app.engine.offline import LevelRun, run_level

from app.engine.scheduler import BLOCK, Scheduler
from app.engine.specdecode import DEFAULT_ACCEPTANCE, geometric_accept
from app.engine.steptime import StepTimeModel
from app.loadgen.capacity import Capacity, capacity_of, level_met, search_levels
from app.loadgen.prompts import TURN_OVERHEAD_TOKENS, LengthSampler, SharedPrefixes
from app.loadgen.records import STATUS_REJECTED, RequestRecord
from app.loadgen.spec import RampSpec
from app.loadgen.stats import StepStats, compute_step_stats, level_window


#: rig seconds between the users' first requests of a level: the load generator builds
#: and sends them one after another (app/loadgen/runner.py), 0.41 ms apart on average
#: over 12 and 32 users against the sim at time scale 1 on the 2-core development
#: machine. What matters is that they are not simultaneous: an idle engine starts a
#: step with the first request alone and the others queue behind it (the TTFT p99 of a
#: level measured from its start is that queue's tail).
SEND_GAP_S = 0.4e-3


@dataclass(frozen=True)
class EngineLimits:
    """What a scheduler of the planned server holds: ``num_blocks`` KV blocks of
    :data:`app.engine.scheduler.BLOCK` tokens (one engine), ``max_num_seqs``,
    ``max_num_batched_tokens``; ``engines`` data parallel replicas."""

    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    engines: int = 1
    #: speculative decoding: draft tokens per step (0: off) and the acceptance rate a of
    #: each draft position given the one before (app.engine.specdecode)
    spec_tokens: int = 0
    spec_acceptance: float = DEFAULT_ACCEPTANCE
    #: vLLM's prefix cache (app.engine.scheduler) and the server's max_model_len (tokens;
    #: bounds a multi-turn conversation's history, None: no bound)
    enable_prefix_caching: bool = False
    max_model_len: int | None = None
    #: a hybrid model's KV cache groups (app.engine.kvcache; None: one full-attention group):
    #: ``num_blocks`` then counts the pool's blocks
    kv_layout: KvCacheLayout | None = None
    #: ``--max-num-active-seqs`` (None: max_num_seqs) and the front end's queue limits
    #: (``--max-num-queued-reqs`` / ``--max-num-queued-tokens``, over every replica)
    max_num_active_seqs: int | None = None
    admission: AdmissionLimits = AdmissionLimits()
    #: the V0 engine without chunked prefill (app.engine.scheduler's ``prefill_first``)
    prefill_first: bool = False

    @classmethod
    def of_tokens(cls, kv_tokens: int, max_num_seqs: int, max_num_batched_tokens: int,
                  engines: int = 1, spec_tokens: int = 0, spec_acceptance: float = DEFAULT_ACCEPTANCE,
                  enable_prefix_caching: bool = False, max_model_len: int | None = None,
                  max_num_active_seqs: int | None = None,
                  admission: AdmissionLimits = AdmissionLimits(),
                  prefill_first: bool = False) -> "EngineLimits":
        return cls(max(1, kv_tokens // BLOCK), max_num_seqs, max_num_batched_tokens, engines,
                   spec_tokens=spec_tokens, spec_acceptance=spec_acceptance,
                   enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
                   max_num_active_seqs=max_num_active_seqs, admission=admission, prefill_first=prefill_first)

    def scheduler(self, step_time, seed: int = 0, max_concurrent_batches: int = 1) -> Scheduler:
        """A fresh scheduler of these limits stepping with ``step_time``; with speculative
        decoding its acceptance draws come from a ``seed``-ed generator (one per level,
        so a prediction is the same every time); ``max_concurrent_batches``: batches in
        flight (the pipeline's stages, :class:`app.engine.scheduler.Scheduler`)."""
        accept = geometric_accept(self.spec_acceptance, random.Random(seed)) if self.spec_tokens else None
        return Scheduler(self.num_blocks, self.max_num_seqs, self.max_num_batched_tokens, step_time,
                         spec_tokens=self.spec_tokens, accept=accept,
                         enable_prefix_caching=self.enable_prefix_caching,
                         max_concurrent_batches=max_concurrent_batches, kv_layout=self.kv_layout,
                         max_num_active_seqs=self.max_num_active_seqs,
                         prefill_first=self.prefill_first)


class RequestStream:
    """The requests of a shared-prefix and/or multi-turn ramp for the engine, one user's
    next at a time (:func:`app.engine.offline.run_level`'s ``next_request``), drawn with
    the load generator's rules and seeds: the lengths from the ramp's
    :class:`LengthSampler` (``sampler``, shared by the whole ramp), the prefixes from
    :class:`SharedPrefixes`, a conversation's turn count from ``Random(f"turns:{seed}")``
    over :meth:`RampSpec.turns_range`, the think times exponential (mean ``think_s``).
    The tokens are identified by block, not by word: block b of shared prefix j is
    ``("prefix", j, b)``; a conversation is one append-only token stream (its prompts and
    replies in turn), so its block b is ``("conv", id, b)`` on every turn; the block that
    straddles the end of a prefix is the conversation's own. A history whose next turn
    would pass ``max_model_len`` ends the conversation (the generator's rule)."""

    def __init__(self, spec: RampSpec, sampler: LengthSampler, max_model_len: int | None = None) -> None:
        self.spec, self.sampler, self.max_model_len = spec, sampler, max_model_len
        self.prefixes = SharedPrefixes(spec.shared_prefix, spec.seed) if spec.shared_prefix is not None else None
        self.turns_rng = random.Random(f"turns:{spec.seed}")
        self.think_rng = random.Random(f"think:{spec.seed}")
        self.convs: dict[int, list] = {}  # user → [id, turns, turn, history tokens, prefix tokens, prefix]
        self.n = 0

    def new_level(self) -> None:
        """Users start afresh at each level (the generator's do)."""
        self.convs.clear()

    def _new(self) -> list:
        self.n += 1
        lo, hi = self.spec.turns_range()
        k = lo if lo == hi else self.turns_rng.randint(lo, hi)
        j = self.prefixes.next() if self.prefixes is not None else None
        return [self.n, k, 0, 0, self.spec.shared_prefix.tokens if j is not None else 0, j]

    def _hashes(self, conv: list, total: int) -> list:
        cid, pre, j = conv[0], conv[4], conv[5]
        full = pre // BLOCK if j is not None else 0
        return [("prefix", j, b) if b < full else ("conv", cid, b) for b in range(total // BLOCK)]

    def think(self, user: int) -> float:
        """Seconds ``user`` thinks before its next request: exponential (mean ``think_s``)
        while its conversation has turns left, 0 before a new one (the generator's rule)."""
        mt, conv = self.spec.multi_turn, self.convs.get(user)
        if mt is None or mt.think_s <= 0 or conv is None or conv[2] >= conv[1]:
            return 0.0
        return self.think_rng.expovariate(1.0 / mt.think_s)

    def __call__(self, user: int) -> tuple[int, int, list, int]:
        p, o = self.sampler.next()
        mt = self.spec.multi_turn
        conv = self.convs.get(user)
        if mt is None:  # one request, one "conversation" of one turn
            conv = self._new()
            return conv[4] + p, o, self._hashes(conv, conv[4] + p + o), 0
        if (conv is not None and conv[2] < conv[1] and self.max_model_len is not None
                and conv[3] + p + TURN_OVERHEAD_TOKENS + o > self.max_model_len):
            conv = None  # the next turn would not fit: a new conversation
        if conv is None or conv[2] >= conv[1]:
            conv = self.convs[user] = self._new()
        prompt = conv[3] + p + (conv[4] if conv[2] == 0 else 0)
        conv[2] += 1
        conv[3] = prompt + o  # the reply joins the history (ignore_eos: max_tokens of it)
        return prompt, o, self._hashes(conv, prompt + o), conv[2]


@dataclass
class PredictedRamp:
    """A ramp as the engine predicts it: ``steps`` (one StepStats per level, rig s, in
    the order run), ``records`` their requests, ``capacity`` the search's answer (None
    for a ramp of fixed levels)."""

    steps: list[StepStats]
    records: list[RequestRecord]
    capacity: Capacity | None = None


def level_records(run: LevelRun, idx: int, level: float) -> list[RequestRecord]:
    """The requests of an engine level as the load generator records them: sent at
    ``Flight.sent``, one output chunk per engine step that sampled tokens (one token,
    or 1 + accepted drafts with speculative decoding, as the sim streams them), TTFT
    and e2e from the send, token counts as the server's usage reports them."""
    out = []
    for f in run.flights:
        if f.rejected is not None:  # the HTTP 503 the load generator records, answered at once
            out.append(RequestRecord(level_idx=idx, level=level, t_start=f.sent, e2e=0.0,
                                     prompt_tokens=f.req.prompt_len, status=STATUS_REJECTED,
                                     error=REJECTED_MESSAGES[f.rejected], turn=f.turn))
            continue
        if not f.tokens:
            continue  # still waiting when the level ended: the generator records it only when it ends
        offs = np.unique(np.asarray(f.tokens, dtype=np.float64)) - f.sent  # a chunk's tokens share its time
        out.append(RequestRecord(level_idx=idx, level=level, t_start=f.sent, ttft=float(offs[0]), e2e=float(offs[-1]),
                                 ttfa=float(offs[0]),  # no reasoning modelled: the first token is the answer's
                                 prompt_tokens=f.req.prompt_len, output_tokens=len(f.tokens),
                                 tokens_source="server_usage", chunk_offsets=offs.astype(np.float32), turn=f.turn))
    return out


def predict_level(model: StepTimeModel, limits: EngineLimits, spec: RampSpec, level: float, idx: int,
                  sampler: LengthSampler, stream: RequestStream | None = None) -> tuple[StepStats, list[RequestRecord]]:
    """One level of ``spec`` on the engine: its StepStats (rig s; t_start 0) and its
    requests (``t_start`` from the level's start). A closed-loop level runs ``level``
    users; a request-rate level (``mode: rate``) sends at the load generator's own
    arrival times (:func:`app.loadgen.arrivals.arrival_times`: the rate, burstiness,
    seed and level index), capped at ``max_concurrency``. ``stream``: a shared-prefix or
    multi-turn ramp's requests, or any request with prefix caching on
    (:class:`RequestStream`, drawing from ``sampler``)."""
    rate = spec.mode == "rate"
    users = 0 if rate else int(level)

    def make() -> Scheduler:
        return limits.scheduler(model.engine_step_time, seed=idx, max_concurrent_batches=model.pipeline_parallel_size)

    if stream is not None:
        stream.new_level()
    run = run_level(make, users, sampler.next, warmup_s=spec.warmup_seconds, step_s=spec.step_seconds,
                    quota=spec.level_quota(level), request_overhead_s=model.params.t_request_s,
                    engines=limits.engines, send_gap_s=SEND_GAP_S, settle_n=users if spec.settles else 0,
                    send_times=spec.arrivals(level, spec.seed, idx) if rate else None,
                    max_concurrency=spec.max_concurrency if rate else None, next_request=stream,
                    admission=limits.admission, retry_wait=lambda _u: spec.retry_wait_s)
    recs = level_records(run, idx, level)
    w0, w1 = level_window(run.reason, run.warmup_end, run.deadline, run.t_stop, run.last_counted_end)
    in_flight = users if not rate else _max_in_flight(run)
    st = compute_step_stats(recs, idx=idx, level=level, mode=spec.mode, t_start=0.0, t_end=run.t_end,
                            window_start=w0, window_end=w1, slo=spec.slo, max_in_flight=in_flight,
                            stop_reason=run.reason, arrivals=run.arrivals if rate else None,
                            send_end=run.t_stop if rate else None)
    return st, recs


def _max_in_flight(run: LevelRun) -> int:
    """The most requests an open-loop level had in flight at once."""
    ev = sorted([(f.sent, 1) for f in run.flights if f.rejected is None]
                + [(f.tokens[-1], -1) for f in run.flights if f.tokens
                                                        and f.req.finish_reason is not None])
    n = most = 0
    for _, d in ev:
        n += d
        most = max(most, n)
    return most


def _run(model: StepTimeModel, limits: EngineLimits, spec: RampSpec,
         levels: tuple[float, ...] | None = None) -> PredictedRamp:
    sampler = LengthSampler.of(spec)
    # with prefix caching every request carries its blocks' identities, as the sim's do: a
    # plain request shares none, but one preempted and admitted again finds its own blocks
    stream = (RequestStream(spec, sampler, limits.max_model_len)
              if spec.per_user_stream() or limits.enable_prefix_caching else None)
    steps: list[StepStats] = []
    records: list[RequestRecord] = []
    judged: list[tuple[int, float, bool]] = []
    idx = 0
    while True:
        repeat = 0
        if levels is not None:  # given levels, in order, with the spec's level shape
            if idx >= len(levels):
                break
            level = levels[idx]
        elif spec.search is not None:
            nxt = search_levels(spec.search, judged, spec.mode)
            if nxt is None:
                break
            repeat, level = nxt
        elif idx < len(spec.levels):
            level = spec.levels[idx]
        else:
            break
        st, recs = predict_level(model, limits, spec, level, idx, sampler, stream)
        st.repeat = repeat
        steps.append(st)
        records += recs
        if spec.search is not None:
            judged.append((repeat, level, level_met(st, spec.slo)))
        idx += 1
    cap = None
    if spec.search is not None and levels is None:
        cap = capacity_of(steps, records, spec.slo, spec.search, spec.mode, {s.idx: s.repeat for s in steps})
        cap.shape = spec.shape
    return PredictedRamp(steps, records, cap)


#: predicted ramps kept (the GUI re-plans as the user types and often comes back to a form)
CACHE_SIZE = 64
_cache: OrderedDict[tuple[str, EngineLimits, str], PredictedRamp] = OrderedDict()
_cache_lock = threading.Lock()


def predict_ramp(model: StepTimeModel, limits: EngineLimits, spec: RampSpec,
                 levels: Sequence[float] | None = None) -> PredictedRamp:
    """Run ``spec`` (its levels, or its capacity search) on the engine: every level
    starts on empty schedulers (the load generator drains each level before the next)
    and the lengths continue from level to level. ``levels``: run exactly these, in
    order, with the spec's level shape (a recorded search's levels again; no capacity).
    Results are cached per step model, limits, spec and levels (the last
    :data:`CACHE_SIZE`); the result is shared: do not change it. A request-rate ramp is
    predicted with the load generator's arrivals (:func:`predict_level`)."""
    spec = spec.model_copy(update={"url": "http://127.0.0.1:8000", "model": None})  # not part of the answer
    lv = tuple(float(x) for x in levels) if levels is not None else None
    key = (repr(model), limits, spec.model_dump_json() + repr(lv))
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    res = _run(model, limits, spec, lv)
    with _cache_lock:
        _cache[key] = res
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return res
