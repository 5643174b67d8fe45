"""Closed-loop ramp levels run entirely in rig time (no HTTP, no wall clock).

The same scheduler and step model as the sim's server, driven the way the load
generator drives a server (app/loadgen/runner.py, ``Ramp._level``): N users start at
the level's start, sending their first requests one after another ``send_gap_s`` apart
(the generator builds and sends them in turn; an idle engine starts a step with the
first one alone and the others queue behind it); each sends its next request the moment its previous
one ends; a request reaches the engine ``request_overhead_s`` after it is sent (HTTP
and tokenization, the step model's ``t_request_s``); after the warm-up the level counts
the requests it sends and stops sending at its quota or ``step_s`` after the
warm-up, whichever comes first (the warm-up may last until each user has finished a
request: ``settle_n``); then it drains the requests in flight. The planner turns a
level's requests into the load generator's own records and statistics
(:mod:`app.planner.predict`); the fidelity and seed tables (benchmarks/sim_fidelity.py)
use :func:`closed_loop`.

With several engines (data parallel replicas, each its own scheduler), each request is
routed when it reaches the front end (``request_overhead_s`` after it is sent) by vLLM's
load balancer (:class:`app.engine.balance.DpBalancer`, the rule the sim's server uses),
and the engines step independently, each on its own clock. Each engine runs vLLM's
engine-core loop (:meth:`app.engine.scheduler.Scheduler.advance`): one step at a time, or
with pipeline parallelism up to ``pipeline_parallel_size`` batches in flight; it sees new
requests while idle or when the batch it waits on ends.

Admission control (``admission``, vLLM's ``--max-num-queued-reqs`` /
``--max-num-queued-tokens``: :mod:`app.engine.admission`): a request is judged when it is
sent, against the requests admitted before it and not yet ended (over every replica) and
their prompts still in prefill; a refused one never
reaches an engine and is kept as a :class:`Flight` with ``rejected`` set (the load
generator's HTTP 503). Its user sends the same request again ``retry_wait(user)`` rig
seconds later (the load generator's wait: no ``Retry-After`` from vLLM, so the user's
think time, else 1 s); a refused request does not count against the level's quota nor
towards its settling (the load generator's rules).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, Protocol, Sequence

from app.engine.admission import AdmissionLimits
from app.engine.kvcache import KvCacheLayout
from app.engine.balance import DpBalancer
from app.engine.scheduler import Request, Scheduler
from app.engine.steptime import PerfParams

#: a request's lengths: () → (prompt tokens, max_tokens)
Lengths = Callable[[], tuple[int, int]]


class NextRequest(Protocol):
    """A user's next request: ``(user)`` → (prompt tokens, max_tokens, its KV block hashes
    or None, turn); ``think(user)`` → the seconds the user thinks before sending it
    (asked first)."""

    def __call__(self, user: int) -> tuple[int, int, Sequence[Hashable] | None, int]: ...

    def think(self, user: int) -> float: ...


@dataclass
class Flight:
    """One request of a level: ``user`` sent it at ``sent`` (rig s); ``req`` is the
    engine's request (arrival = when the engine saw it); ``engine`` the data parallel
    replica it was routed to; ``tokens`` the rig times its output tokens were sampled,
    one per token (the tokens of one chunk — speculative decoding — share its time)."""

    user: int
    sent: float
    req: Request
    then: Callable[["Flight", float], None] | None = None  # (this flight, end time): the user's next send
    tokens: list[float] = field(default_factory=list)
    engine: int = 0
    turn: int = 0  # its conversation turn (multi-turn workloads; 0: none)
    #: refused by admission control (the reason, one of app.engine.admission.ADMISSION_REASONS); None: admitted
    rejected: str | None = None

    def on_token(self, req: Request, t: float) -> None:
        self.tokens.extend([t] * max(1, req.output - len(self.tokens)))

    def on_finish(self, req: Request, t: float) -> None:
        if self.then is not None:
            self.then(self, t)


@dataclass
class LevelRun:
    """What one level did, in rig seconds from its start. ``flights``: every request
    sent, in the order sent; ``warmup_end``: when counting began; ``t_stop``: when the
    level stopped sending; ``t_end``: when its last request ended; ``reason``: why it
    stopped sending — ``count`` (the quota of counted requests was sent) or
    ``duration`` (``step_s`` after the warm-up passed); ``deadline``: when it would have
    stopped by time; ``preemptions``: over the level; ``arrivals``: an open-loop level's
    arrivals (empty for a closed-loop one)."""

    users: int
    flights: list[Flight]
    warmup_end: float
    deadline: float
    t_stop: float
    t_end: float
    reason: str
    preemptions: int
    #: open loop: every arrival as (scheduled, sent or None, waited at the cap), rig s
    arrivals: list[tuple[float, float | None, bool]] = field(default_factory=list)

    @property
    def last_counted_end(self) -> float | None:
        """When the last request sent after the warm-up ended (None: none did)."""
        ends = [f.tokens[-1] for f in self.flights if f.sent >= self.warmup_end and f.tokens
                and f.req.finish_reason is not None]
        return max(ends) if ends else None


@dataclass(slots=True)
class _LevelState:
    """Where a level of :func:`run_level` is: requests counted after the warm-up
    (``issued``), sent (``n``), ended (``done``) and in flight; whether it stopped sending,
    why and when; whether the warm-up settled, when counting began (``w0``) and the
    deadline by time."""

    w0: float
    deadline: float
    settled: bool
    issued: int = 0
    n: int = 0
    done: int = 0
    in_flight: int = 0
    stopped: bool = False
    reason: str = "duration"
    t_stop: float = math.inf


@dataclass(slots=True)
class _Arrival:
    """An open-loop arrival: ``scheduled`` (rig s), ``sent`` (None: not yet, or never),
    ``waited`` at the concurrency cap."""

    scheduled: float
    sent: float | None = None
    waited: bool = False


def run_level(make_scheduler: Callable[[], Scheduler], users: int, lengths: Lengths, *, warmup_s: float = 0.0,
              step_s: float | None = None, quota: int | None = None, request_overhead_s: float = 0.0,
              engines: int = 1, send_gap_s: float = 0.0, settle_n: int = 0,
              send_times: Iterator[float] | None = None, max_concurrency: int | None = None,
              next_request: NextRequest | None = None, admission: AdmissionLimits | None = None,
              retry_wait: Callable[[int], float] | None = None) -> LevelRun:
    """Run one closed-loop level of ``users`` on ``engines`` fresh schedulers from
    ``make_scheduler()``. ``lengths()`` gives each request's (prompt, max_tokens) in the
    order they are sent; user u sends its first at u·``send_gap_s``. The warm-up ends at
    ``warmup_s`` or, with ``settle_n``, once ``settle_n`` requests have ended (at least
    ``warmup_s``; if they have not by ``warmup_s + step_s``, at ``warmup_s``) — the load
    generator's ``settle``. The level stops sending once ``quota`` requests were sent after
    the warm-up (None: no quota) or ``step_s`` after it (None: no time limit), then
    drains. Raises ValueError when neither ends the level.

    Open loop (``send_times``, increasing rig s from the level's start; ``users`` is then
    ignored): a request arrives at each time — counted against the quota and the
    deadline then, as the load generator's arrivals are — and is sent at once, or, with
    ``max_concurrency`` requests in flight, when one of them ends (the generator's
    semaphore); an arrival still waiting when the level stops sending is never sent.
    ``LevelRun.arrivals`` lists them.

    ``next_request`` (instead of ``lengths``): each user's next request with its KV block
    hashes (the prefix cache of a scheduler with ``enable_prefix_caching``) and its
    conversation turn; ``next_request.think(user)``: the seconds the user thinks before it
    (it sends that long after its previous request ended — a multi-turn workload).

    ``admission``: the server's queue limits (module docstring); ``retry_wait(user)``: the
    rig seconds a refused user waits before it sends the same request again (None: 1 s).
    An open-loop arrival that is refused is not sent again."""
    if step_s is None and quota is None:
        raise ValueError("a level needs an end: step_s and/or quota")
    open_loop = send_times is not None
    if (users < 1 and not open_loop) or engines < 1:
        raise ValueError(f"users {users}, engines {engines}: need at least 1 of each")
    engs = [make_scheduler() for _ in range(engines)]
    balancer = DpBalancer(engines)
    arrivals: list[tuple[float, int, Flight]] = []  # sent, not yet at the front end's engine client
    step = step_s if step_s is not None else math.inf
    flights: list[Flight] = []
    gate = admission if admission is not None and admission.active else None
    in_engine: dict[int, Flight] = {}  # id() → the admitted flights not yet ended (app.engine.admission)
    deferred: list[tuple[float, int, int, Flight | None]] = []  # (send time, order, user, request to send again)
    now = [0.0]  # the time of the event being processed (rig s)
    w0 = math.inf if settle_n else warmup_s
    st = _LevelState(w0=w0, deadline=w0 + step, settled=not settle_n)

    def settle(now: float) -> None:
        st.settled, st.w0 = True, max(now, warmup_s)
        st.deadline = st.w0 + step

    def stop(reason: str, t: float) -> None:
        st.stopped, st.reason, st.t_stop = True, reason, t

    def may_issue(t: float) -> bool:
        """Account for one more request at ``t`` (``may_issue`` of the load generator)."""
        if st.stopped:
            return False
        if not st.settled and t >= warmup_s + step:  # it did not settle in time: the warm-up stands
            settle(warmup_s)
        if t >= st.deadline:
            stop("duration", st.deadline)
            return False
        if quota is not None and t >= st.w0:
            if st.issued >= quota:
                stop("count", t)
                return False
            st.issued += 1
        return True

    def send(uid: int, t: float, first: bool = False) -> None:
        """User ``uid`` wants to send at ``t`` (a multi-turn user after thinking)."""
        if st.stopped:
            return
        if next_request is not None and not first:
            t += next_request.think(uid)
        if gate is not None and (first or t > now[0]):  # judged when it is sent, against the server then
            heapq.heappush(deferred, (t, len(flights) + len(deferred), uid, None))
            return
        if may_issue(t):
            issue(uid, t)

    def issue(uid: int, t: float, again: Flight | None = None) -> None:
        hashes: Sequence[Hashable] | None = None
        turn = 0
        if again is not None:  # a refused request, sent again as it was
            p, o, hashes, turn = again.req.prompt_len, again.req.max_tokens, again.req.block_hashes, again.turn
        elif next_request is None:
            p, o = lengths()
        else:  # drawn once the request is sent, as the load generator draws it
            p, o, hashes, turn = next_request(uid)
        st.n += 1
        arrive = t + request_overhead_s
        f = Flight(uid, t, Request(f"u{uid}-{st.n}", p, o, arrive, block_hashes=hashes), ended, turn=turn)
        f.req.sink = f
        flights.append(f)
        if gate is not None:
            why = gate.refusal(len(in_engine), sum(g.req.prompt_len for g in in_engine.values() if not g.tokens))
            if why is not None:  # refused at once: it holds nothing, its user waits and sends it again
                f.rejected = why
                if quota is not None and t >= st.w0:
                    st.issued -= 1  # a refusal is not one of the level's measured requests
                if uid >= 0:
                    wait = retry_wait(uid) if retry_wait is not None else 1.0
                    heapq.heappush(deferred, (t + wait, len(flights) + len(deferred), uid, f))
                return
            in_engine[id(f)] = f
        st.in_flight += 1
        heapq.heappush(arrivals, (arrive, st.n, f))

    def ended(f: Flight, t: float) -> None:
        """``f`` ended at ``t``: its engine is told, it counts (settling), then its user's next
        (open loop: the next arrival waiting at the cap, unless the level stopped sending)."""
        balancer.finished(f.engine)
        in_engine.pop(id(f), None)
        st.done += 1
        st.in_flight -= 1
        if not st.settled and st.done >= settle_n:
            settle(t)
        if not open_loop:
            send(f.user, t)
        elif waiting:
            if st.stopped or t >= st.deadline:
                waiting.clear()  # held back: never sent
            else:
                entry = waiting.pop(0)
                entry.sent = t
                issue(-1, t)

    waiting: list[_Arrival] = []  # open loop: arrivals waiting at the cap
    opened: list[_Arrival] = []  # open loop: every arrival
    times: Iterator[float] = iter(send_times) if send_times is not None else iter(())
    next_at = next(times, math.inf) if open_loop else math.inf

    def arrive_at(t: float) -> None:
        """Open loop: the request scheduled at ``t`` arrives."""
        if not may_issue(t):
            return
        entry = _Arrival(t)
        opened.append(entry)
        if max_concurrency is not None and st.in_flight >= max_concurrency:
            entry.waited = True
            waiting.append(entry)
        else:
            entry.sent = t
            issue(-1, t)

    def counts() -> list[tuple[int, int, float]]:
        return [(len(e.waiting), len(e.running), e.kv_usage) for e in engs]

    for u in range(0 if open_loop else users):
        send(u, u * send_gap_s, first=True)
    t_end = 0.0
    while True:
        # the next event time: steps that end then complete first, then the arrivals then are
        # routed (they see the engines freed) and join the steps that start then
        t = arrivals[0][0] if arrivals else math.inf
        for e in engs:
            due = e.next_due
            if due is not None and due < t:
                t = due
        if next_at < t and not st.stopped:  # open loop: the next request is sent (or waits)
            arrive_at(next_at)
            next_at = next(times, math.inf)
            continue
        if deferred and deferred[0][0] < t:  # a user sends (first, after thinking, or again after a refusal)
            ts, _, uid, again = heapq.heappop(deferred)
            now[0] = ts
            if not st.stopped and may_issue(ts):
                issue(uid, ts, again)
            continue
        if t == math.inf:
            break
        now[0] = t
        woken = []
        for e in engs:
            if e.next_due == t:  # the batch the engine was blocked on ended
                e.complete_due(t)
                t_end = t
                woken.append(e)
        while arrivals and arrivals[0][0] <= t:  # routed as they reach the engine client
            f = heapq.heappop(arrivals)[2]
            f.engine = balancer.choose(t, counts)
            e = engs[f.engine]
            e.add(f.req)
            if e.next_due is None and e not in woken:
                woken.append(e)
        for e in woken:  # the engine-core loop: schedule what it can, complete what has ended
            if e.advance(t):
                t_end = t
    if not st.settled:
        settle(warmup_s)
    if not st.stopped:  # every user's requests ended before the level did (cannot send more)
        stop("duration", min(st.deadline, t_end))
    return LevelRun(users, flights, st.w0, st.deadline, st.t_stop, t_end, st.reason,
                    sum(e.num_preemptions for e in engs), [(a.scheduled, a.sent, a.waited) for a in opened])


@dataclass
class LevelResult:
    """One concurrency level: throughput in output tokens/s over the measured window
    (rig s); TTFT (s) of requests sent in the window; ITL (s) of requests sent in the
    window (``requests``); preemptions over the level."""

    users: int
    throughput: float
    ttft_mean: float
    ttft_p99: float
    itl_mean: float
    requests: int
    preemptions: int


def closed_loop(make_scheduler: Callable[[], Scheduler], users: int, prompt_len: int, output_len: int,
                duration_s: float = 120.0,
                warmup_s: float = 20.0, request_overhead_s: float = 0.0) -> LevelResult:
    """:func:`run_level` with fixed lengths for ``warmup_s + duration_s`` rig seconds,
    summarised over the window after the warm-up: output tokens sampled in it ÷ its
    length, TTFT and ITL of the requests sent in it (nearest-rank p99). The benchmarks'
    quick figure; the planner uses the load generator's statistics instead."""
    lv = run_level(make_scheduler, users, lambda: (prompt_len, output_len), warmup_s=warmup_s, step_s=duration_s,
                   request_overhead_s=request_overhead_s)
    w0, w1 = warmup_s, warmup_s + duration_s
    toks = sum(1 for f in lv.flights for x in f.tokens if w0 <= x <= w1)
    sent = [f for f in lv.flights if w0 <= f.sent <= w1 and f.tokens]
    ttfts = sorted(f.tokens[0] - f.sent for f in sent)
    itls = [(f.tokens[-1] - f.tokens[0]) / (len(f.tokens) - 1) for f in sent if len(f.tokens) > 1]
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan")
    return LevelResult(users, toks / duration_s, sum(ttfts) / len(ttfts) if ttfts else float("nan"), p99,
                       sum(itls) / len(itls) if itls else float("nan"), len(sent), lv.preemptions)


class RigPlan(Protocol):
    """What :func:`sim_level` reads of a sim rig's plan (:class:`app.sim.model_adapter.SimPlan`)."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    @property
    def kv_layout(self) -> KvCacheLayout | None: ...


class RigStepModel(Protocol):
    """What :func:`sim_level` reads of a sim rig's step model (:class:`app.sim.model_adapter.StepModel`)."""

    @property
    def pipeline_parallel_size(self) -> int: ...

    @property
    def params(self) -> PerfParams: ...

    def engine_step_time(self, decode_batch: int, decode_context_sum: float, prefill_tokens: int,
                         prefill_attention: float = 0.0, spec_tokens: int = 0) -> float | tuple[float, float]: ...


def sim_level(sim_plan: RigPlan, step_model: RigStepModel, users: int, prompt_len: int, output_len: int,
              duration_s: float = 120.0,
              warmup_s: float = 20.0) -> LevelResult:
    """:func:`closed_loop` on the rig of ``sim_plan`` (:class:`app.sim.model_adapter.SimPlan`)
    stepping with ``step_model`` (:class:`~app.sim.model_adapter.StepModel`), its
    per-request overhead included — what the sim server does, without HTTP."""
    sp, sm = sim_plan, step_model
    return closed_loop(lambda: Scheduler(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens, sm.engine_step_time,
                                         max_concurrent_batches=sm.pipeline_parallel_size,
                                         kv_layout=sp.kv_layout),
                       users, prompt_len, output_len, duration_s, warmup_s, sm.params.t_request_s)
