"""Closed-loop ramps run entirely in rig time (no HTTP, no wall clock).

The same scheduler and step model as the server, driven by N users who each send a
new request the moment the previous one finishes. Used for the fidelity and seed
tables (benchmarks/sim_fidelity.py) and for fast tests of the curve's shape.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from app.engine.scheduler import Request, Scheduler


@dataclass
class LevelResult:
    """One concurrency level: throughput in output tokens/s over the measured window
    (rig s); TTFT (s) of requests sent in the window that got their first token; ITL (s)
    of requests sent and finished in the window (``requests``); preemptions counted in
    the window."""

    users: int
    throughput: float
    ttft_mean: float
    ttft_p99: float
    itl_mean: float
    requests: int
    preemptions: int


class _User:
    def __init__(self, loop: "_Loop", uid: int) -> None:
        self.loop, self.uid = loop, uid

    def on_token(self, req: Request, t: float) -> None:
        self.loop.tokens.append(t)

    def on_finish(self, req: Request, t: float) -> None:
        self.loop.done.append(req)
        self.loop.submit(self, t)


class _Loop:
    def __init__(self, sched: Scheduler, prompt: int, output: int, overhead: float = 0.0) -> None:
        self.sched, self.prompt, self.output, self.overhead = sched, prompt, output, overhead
        self.tokens: list[float] = []
        self.done: list[Request] = []
        self.all: list[Request] = []
        self.pending: list[tuple[float, int, Request]] = []  # (time it reaches the engine, n, request)
        self.n = 0

    def submit(self, user: _User, t: float) -> None:
        """The user sends at ``t``; the engine sees the request ``overhead`` s later (the
        server does the same: HTTP and tokenization before the scheduler)."""
        self.n += 1
        r = Request(f"u{user.uid}-{self.n}", self.prompt, self.output, t, None, user)
        self.all.append(r)
        heapq.heappush(self.pending, (t + self.overhead, self.n, r))

    def release(self, t: float) -> None:
        while self.pending and self.pending[0][0] <= t:
            self.sched.add(heapq.heappop(self.pending)[2])


def closed_loop(make_scheduler, users: int, prompt_len: int, output_len: int, duration_s: float = 120.0,
                warmup_s: float = 20.0, request_overhead_s: float = 0.0) -> LevelResult:
    """Run ``users`` closed-loop users for ``warmup_s + duration_s`` rig seconds on a
    fresh scheduler from ``make_scheduler()``; measure after the warm-up.
    ``request_overhead_s``: time each request spends before the engine sees it (the
    step model's ``t_request_s``); it counts in TTFT and e2e, as for a real client."""
    sched: Scheduler = make_scheduler()
    loop = _Loop(sched, prompt_len, output_len, request_overhead_s)
    for u in range(users):
        loop.submit(_User(loop, u), 0.0)
    t = 0.0
    end = warmup_s + duration_s
    pre0 = None
    while t < end:
        loop.release(t)
        step = sched.schedule(t)
        if step is None:
            if loop.pending:  # idle until the next request reaches the engine
                t = max(t, loop.pending[0][0])
                continue
            break
        t += step.dt
        sched.complete(step, t)
        if pre0 is None and t >= warmup_s:
            pre0 = sched.num_preemptions
    span = max(t - warmup_s, 1e-9)
    toks = sum(1 for x in loop.tokens if warmup_s <= x <= t)
    reqs = [r for r in loop.done if r.arrival >= warmup_s]
    ttfts = sorted(r.first_token - r.arrival for r in loop.all if r.arrival >= warmup_s and r.first_token is not None)
    itls = [(r.last_token - r.first_token) / (r.output - 1) for r in reqs if r.output > 1]
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan")
    return LevelResult(users, toks / span, sum(ttfts) / len(ttfts) if ttfts else float("nan"), p99,
                       sum(itls) / len(itls) if itls else float("nan"), len(reqs),
                       sched.num_preemptions - (pre0 or 0))


def sim_level(sim_plan, step_model, users: int, prompt_len: int, output_len: int, duration_s: float = 120.0,
              warmup_s: float = 20.0) -> LevelResult:
    """:func:`closed_loop` on the rig of ``sim_plan`` (:class:`app.sim.model_adapter.SimPlan`)
    stepping with ``step_model`` (:class:`~app.sim.model_adapter.StepModel`), its
    per-request overhead included — what the sim server does, without HTTP."""
    sp, sm = sim_plan, step_model
    return closed_loop(lambda: Scheduler(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens, sm.step_time),
                       users, prompt_len, output_len, duration_s, warmup_s, sm.params.t_request_s)
