"""The sim's engine loop: the scheduler stepped in rig time, paced to the wall clock.

Rig time runs ``k`` (``--sim-time-scale``) times faster than the wall clock:
``rig = (monotonic() − t0) · k``. Each step is planned at rig time T, lasts ``dt`` rig
seconds (performance model × thermal slowdown) and its tokens are handed to the
clients at wall time ``t0 + (T + dt)/k``. When the process falls behind (Python work
for many streams takes longer than the steps it simulates), the engine runs several
steps back to back before yielding, so each client receives several tokens in one
write instead of rig time drifting; it says so in its log (once per 5 s at most).

With data parallel replicas each replica is one :class:`SimEngine` (its own scheduler,
KV blocks, cards and loop), all on one rig clock (``t0``); the HTTP front end routes
each request to one of them (app/sim/http_api.py, :class:`app.engine.balance.DpBalancer`).
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from typing import Callable

from app.sim import vlog
from app.sim.gpus import GpuBank
from app.sim.metrics import SimMetrics
from app.engine.kvcache import KvCacheLayout
from app.engine.scheduler import Request, Scheduler, Step, block_hashes
from app.engine.specdecode import DEFAULT_ACCEPTANCE, geometric_accept

#: wall seconds behind schedule before the engine stops yielding after every step
COALESCE_AFTER_S = 0.005
#: longest run of back-to-back steps (wall s) before the engine yields anyway
MAX_BURST_S = 0.05
STATS_EVERY_S = 5.0


class Stream:
    """A request's link to its HTTP handler: ``pending`` tokens not yet written, in
    ``chunks`` (the tokens of each engine step: one, or 1 + accepted drafts with
    speculative decoding — vLLM streams a step's tokens in one delta), ``finished`` once
    the last token is out; ``error`` the engine's message when it died under the
    request; ``event`` wakes the handler."""

    __slots__ = ("req", "pending", "chunks", "counted", "finished", "error", "event")

    def __init__(self) -> None:
        self.req: Request | None = None
        self.pending = 0
        self.chunks: deque[int] = deque()
        self.counted = 0  # tokens handed over so far (written or pending)
        self.finished = False
        self.error: str | None = None
        self.event = asyncio.Event()

    def on_token(self, req: Request, t: float) -> None:
        n = max(1, req.output - self.counted)
        self.counted += n
        self.pending += n
        self.chunks.append(n)
        self.event.set()

    def on_finish(self, req: Request, t: float) -> None:
        self.finished = True
        self.event.set()


class SimEngine:
    """Owns one replica's scheduler, steps its virtual GPUs and records its metrics;
    ``time_scale`` = k.

    ``step_time`` as :meth:`app.sim.model_adapter.StepModel.step_time`. Call
    :meth:`submit` from handlers and run :meth:`run` as a task. ``index``: the data
    parallel rank (its cards in ``gpus``, its ``engine`` label in ``metrics``);
    ``t0``: the rig clock's start (monotonic s), shared by the replicas;
    ``on_done(index)``: called when a request of this engine finishes or is aborted
    (the load balancer's in-flight count). ``spec_tokens`` k > 0: speculative decoding,
    each draft position accepted with probability ``spec_acceptance`` given the one
    before (:mod:`app.engine.specdecode`; the draws seeded from ``seed`` and ``index``),
    counted in vLLM's ``vllm:spec_decode_*`` counters. ``max_concurrent_batches``: the
    pipeline's batches in flight (``pipeline_parallel_size``): the loop is the scheduler's
    engine-core loop (:meth:`app.engine.scheduler.Scheduler.advance`), paced to the end
    of the batch it waits on.
    """

    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, step_time,
                 gpus: GpuBank, metrics: SimMetrics, time_scale: float = 1.0, seed: int = 0,
                 request_overhead_s: float = 0.0, index: int = 0, t0: float | None = None,
                 on_done: Callable[[int], None] | None = None, spec_tokens: int = 0,
                 spec_acceptance: float = DEFAULT_ACCEPTANCE, enable_prefix_caching: bool = False,
                 max_concurrent_batches: int = 1, kv_layout: KvCacheLayout | None = None,
                 max_num_active_seqs: int | None = None) -> None:
        self.k = float(time_scale)
        #: rig seconds a request spends outside the engine steps before it is queued (HTTP,
        #: tokenization, output processing): the step model's t_request_s
        self.request_overhead_s = float(request_overhead_s)
        self.gpus = gpus
        self.index = index
        self.sim_metrics = metrics  # every replica's series (one registry)
        self.metrics = metrics.engine(index)
        self.on_done = on_done
        self._step_time = step_time
        accept = geometric_accept(spec_acceptance, random.Random(7919 * seed + 104729 * index + 1)) \
            if spec_tokens else None
        self.sched = Scheduler(num_blocks, max_num_seqs, max_num_batched_tokens, self._timed,
                               on_first_token=self._first, on_finished=self._finished, on_token=self._token,
                               spec_tokens=spec_tokens, accept=accept, enable_prefix_caching=enable_prefix_caching,
                               max_concurrent_batches=max_concurrent_batches, kv_layout=kv_layout,
                               max_num_active_seqs=max_num_active_seqs)
        self._spec_seen = (0, 0, 0, [0] * spec_tokens)  # counters exported so far
        self._spec_logged = (0, 0, 0, [0] * spec_tokens)  # counts at the last SpecDecoding log line
        self._reported_prefix = (0, 0)  # (queries, hits) already added to the metrics
        self._prefix_log = (0, 0)  # (queries, hits) at the last stats line
        self.rng = random.Random(seed + 1000003 * index)
        self.t0 = time.monotonic() if t0 is None else t0
        self.T = 0.0
        self._wake = asyncio.Event()
        self._stop = False
        self._n = 0
        # pacing figures (wall seconds)
        self.max_lag = 0.0
        self.lags: deque[float] = deque(maxlen=4096)
        self.coalesced_steps = 0
        self.steps = 0
        self.busy_rig = 0.0
        self._last_coalesce_log = -1e9
        self._stats = (time.monotonic(), 0, 0, 0.0)
        self._reported_preemptions = 0
        self._due: float | None = None  # wall time (monotonic) the step in flight ends

    # ------------------------------------------------------------------ clocks
    def rig_now(self) -> float:
        """Rig seconds since the engine started (wall × k)."""
        return (time.monotonic() - self.t0) * self.k

    def _timed(self, b: int, ctx: float, n: int, attn2: float, *spec: int) -> float | tuple[float, float]:
        t = self._step_time(b, ctx, n, attn2, *spec)
        s = self.gpus.slowdown_of(self.index)
        return (t[0] * s, t[1] * s) if isinstance(t, tuple) else t * s

    def _count_spec(self) -> None:
        """Add the scheduler's speculative-decoding counts since the last step to the
        ``vllm:spec_decode_*`` counters (vLLM's ``SpecDecodingProm.observe``)."""
        s = self.sched
        d0, t0, a0, p0 = self._spec_seen
        if s.spec_drafts == d0:
            return
        m = self.metrics
        m.spec_drafts.inc(s.spec_drafts - d0)
        m.spec_draft_tokens.inc(s.spec_draft_tokens - t0)
        m.spec_accepted.inc(s.spec_accepted - a0)
        for i, c in enumerate(m.spec_accepted_per_pos):
            c.inc(s.spec_accepted_per_pos[i] - p0[i])
        self._spec_seen = (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted, list(s.spec_accepted_per_pos))

    # ------------------------------------------------------------------ metrics hooks
    def _first(self, r: Request, t: float) -> None:
        m = self.metrics
        m.ttft.observe(t - r.arrival)
        m.queue.observe((r.first_scheduled or t) - r.arrival)
        m.prompt_tokens.inc(r.prompt_len)
        m.prompt_hist.observe(r.prompt_len)

    def _token(self, r: Request, t: float) -> None:
        self.metrics.itl.observe(t - r.last_token)

    def _finished(self, r: Request, t: float) -> None:
        self.metrics.e2e.observe(t - r.arrival)
        self.metrics.success[r.finish_reason].inc()
        if self.on_done is not None:
            self.on_done(self.index)

    # ------------------------------------------------------------------ requests
    def submit(self, prompt_len: int, max_tokens: int, ignore_eos: bool, tokens=None) -> Stream:
        """Queue a request now (rig time); returns its :class:`Stream`. ``tokens``: the
        token identities of its prompt and of the output it will generate (a sequence,
        or a callable giving it), hashed into blocks for the prefix cache when caching
        is on (None: the request shares no block)."""
        self._n += 1
        eos_at = None if ignore_eos else 1 + int(self.rng.expovariate(1 / 200.0))
        s = Stream()
        hs = None
        if tokens is not None and self.sched.enable_prefix_caching:
            hs = block_hashes(tokens() if callable(tokens) else tokens)
        s.req = Request(f"cmpl-{self.index}-{self._n}", prompt_len, max_tokens, self.rig_now(), eos_at, s,
                        block_hashes=hs)
        self.sched.add(s.req)
        self._wake.set()
        return s

    def abort(self, s: Stream) -> None:
        if s.req is not None and s.req.finish_reason is None:
            self.sched.abort(s.req)
            self.metrics.success["abort"].inc()
            if self.on_done is not None:
                self.on_done(self.index)

    def stop(self) -> None:
        self._stop = True
        self._wake.set()

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        sched, k = self.sched, self.k
        burst_start = None
        while not self._stop:
            self._maybe_log_stats()
            if not sched.has_work:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), STATS_EVERY_S)
                except asyncio.TimeoutError:
                    pass
                self.T = max(self.T, self.rig_now())
                burst_start = None
                continue
            if sched.next_due is None:  # idle: the engine-core loop schedules (app.engine.scheduler)
                for done in sched.advance(self.T):
                    self._account(done)
            t_end = sched.next_due
            if t_end is None:  # waiting requests that do not fit yet and nothing running
                self._wake.clear()
                await self._wake.wait()
                self.T = max(self.T, self.rig_now())
                continue
            self._due = self.t0 + t_end / k
            delay = self._due - time.monotonic()
            if delay > 0:
                burst_start = None
                await asyncio.sleep(delay)
            else:
                lag = -delay
                self.lags.append(lag)
                if lag > self.max_lag:
                    self.max_lag = lag
                if lag > COALESCE_AFTER_S:
                    now = time.monotonic()
                    if burst_start is None:
                        burst_start = now
                    if now - burst_start < MAX_BURST_S:
                        self.coalesced_steps += 1
                        self._log_coalescing(lag)
                    else:
                        burst_start = None
                        await asyncio.sleep(0)
                else:
                    burst_start = None
                    await asyncio.sleep(0)
            g0 = sched.generation_tokens
            step = sched.complete_due(t_end)
            self.metrics.generation_tokens.inc(sched.generation_tokens - g0)
            if step is not None:
                self._account(step)
            self.T = t_end
            self._due = None
            g0 = sched.generation_tokens
            for done in sched.advance(self.T):  # the next batches (and any that ended with it)
                self._account(done)
            self.metrics.generation_tokens.inc(sched.generation_tokens - g0)
            if not sched.has_work:
                self.T = max(self.T, self.rig_now())

    def _account(self, step: Step) -> None:
        """Metrics and the cards' load after batch ``step`` ended (rig s ``step.end``): each
        card worked ``step.interval`` on it (its stage's share; the whole step with one stage)."""
        sched = self.sched
        if sched.spec_tokens:
            self._count_spec()
        if sched.num_preemptions != self._reported_preemptions:
            self.metrics.preemptions.inc(sched.num_preemptions - self._reported_preemptions)
            self._reported_preemptions = sched.num_preemptions
        q, h = sched.prefix_queries, sched.prefix_hits
        if (q, h) != self._reported_prefix:
            q0, h0 = self._reported_prefix
            self.metrics.prefix_queries.inc(q - q0)
            self.metrics.prefix_hits.inc(h - h0)
            self._reported_prefix = (q, h)
        self.gpus.busy(step.end, step.interval, self.index)
        self.busy_rig += step.interval
        self.steps += 1

    def _log_coalescing(self, lag: float) -> None:
        now = time.monotonic()
        if now - self._last_coalesce_log >= STATS_EVERY_S:
            self._last_coalesce_log = now
            vlog.emit(f"Sim engine is {lag * 1e3:.1f} ms (wall) behind the rig clock: running steps back to back "
                      f"and coalescing several tokens per write ({self.coalesced_steps} steps coalesced so far)",
                      level="WARNING", process=f"EngineCore_DP{self.index}", where="sim_engine.py:1")

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        t_last, p_last, g_last, rig_last = self._stats
        if now - t_last < STATS_EVERY_S:
            return
        s = self.sched
        rig = self.rig_now()
        span = max(rig - rig_last, 1e-9)
        p, g = s.prompt_tokens_done, s.generation_tokens
        self._stats = (now, p, g, rig)
        if p == p_last and g == g_last and not s.has_work:
            return
        # vLLM logs the hit rate of its most recent 1000 requests (CachingMetrics, vllm/v1/metrics/stats.py);
        # the sim: of the tokens queried since the last line, or the whole run's before it has any
        q0, h0 = self._prefix_log
        q, h = s.prefix_queries, s.prefix_hits
        self._prefix_log = (q, h)
        rate = (h - h0) / (q - q0) if q > q0 else (h / q if q else 0.0)
        vlog.emit(f"Engine {self.index:03d}: Avg prompt throughput: {(p - p_last) / span:.1f} tokens/s, Avg generation "
                  f"throughput: {(g - g_last) / span:.1f} tokens/s, Running: {len(s.running)} reqs, Waiting: "
                  f"{len(s.waiting)} reqs, GPU KV cache usage: {100 * s.kv_usage:.1f}%, Prefix cache hit rate: "
                  f"{100 * rate:.1f}%", process="APIServer", where="loggers.py:123")
        if s.spec_tokens:
            self._log_spec(span)

    def _log_spec(self, span: float) -> None:
        """vLLM's ``SpecDecodingLogging.log`` line (vllm/v1/spec_decode/metrics.py, 0.32) for
        the drafts since the last one: mean acceptance length (bonus token counted),
        accepted and drafted tokens/s, per-position and average acceptance rates."""
        s = self.sched
        d0, t0, a0, p0 = self._spec_logged
        drafts, drafted, accepted = s.spec_drafts - d0, s.spec_draft_tokens - t0, s.spec_accepted - a0
        self._spec_logged = (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted, list(s.spec_accepted_per_pos))
        if not drafts:
            return
        rates = ", ".join(f"{(s.spec_accepted_per_pos[i] - p0[i]) / drafts:.3f}" for i in range(s.spec_tokens))
        vlog.emit(f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, Accepted throughput: "
                  f"{accepted / span:.2f} tokens/s, Drafted throughput: {drafted / span:.2f} tokens/s, Accepted: "
                  f"{accepted} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, Avg Draft "
                  f"acceptance rate: {100 * accepted / max(drafted, 1):.1f}%", process="APIServer",
                  where="metrics.py:120")

    def reset_pacing(self) -> None:
        """Start a new measurement window for the pacing figures of :meth:`info`."""
        self.max_lag = 0.0
        self.lags.clear()
        self.coalesced_steps = 0

    def behind(self) -> float:
        """Wall seconds the engine trails the wall clock now (0 when on time or idle)."""
        if self._due is not None:
            return max(0.0, time.monotonic() - self._due)
        if self.sched.has_work:
            return max(0.0, self.rig_now() - self.T) / self.k
        return 0.0

    def sim_now(self) -> float:
        """The rig time the engine has reached: the wall clock × k minus what it trails by."""
        return self.rig_now() - self.behind() * self.k

    def info(self) -> dict:
        """Pacing figures for ``/sim/info`` (wall seconds unless named rig)."""
        lags = sorted(self.lags)
        p99 = lags[int(0.99 * (len(lags) - 1))] if lags else 0.0
        wall = time.monotonic() - self.t0
        return {"rig_time_s": self.T, "rig_now_s": self.rig_now(), "sim_now_s": self.sim_now(), "wall_time_s": wall,
                "behind_s": self.behind(),
                "max_lag_s": self.max_lag, "p99_lag_s": p99, "steps": self.steps,
                "coalesced_steps": self.coalesced_steps, "busy_rig_s": self.busy_rig,
                "running": len(self.sched.running), "waiting": len(self.sched.waiting),
                "kv_cache_usage": self.sched.kv_usage, "preemptions": self.sched.num_preemptions,
                "prefix_cache_queries": self.sched.prefix_queries, "prefix_cache_hits": self.sched.prefix_hits,
                "slowdown": self.gpus.slowdown_of(self.index)}


#: how the figures of :meth:`SimEngine.info` combine over replicas
_SUMMED = ("steps", "coalesced_steps", "busy_rig_s", "running", "waiting", "preemptions", "prefix_cache_queries",
           "prefix_cache_hits")
_LARGEST = ("max_lag_s", "p99_lag_s", "behind_s", "slowdown", "wall_time_s")
_SMALLEST = ("rig_time_s", "rig_now_s", "sim_now_s")


def combined_info(infos: list[dict]) -> dict:
    """The replicas' :meth:`SimEngine.info` as one: counts summed, lags and slowdown the
    worst, clocks the one furthest behind, KV cache usage the mean. One replica: its own."""
    if len(infos) == 1:
        return dict(infos[0])
    out = {k: sum(i[k] for i in infos) for k in _SUMMED}
    out.update({k: max(i[k] for i in infos) for k in _LARGEST})
    out.update({k: min(i[k] for i in infos) for k in _SMALLEST})
    out["kv_cache_usage"] = sum(i["kv_cache_usage"] for i in infos) / len(infos)
    return out
