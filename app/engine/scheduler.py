"""A continuous-batching scheduler shaped like vLLM V1's, in rig (simulated) time.

Each step: running requests first (decode = 1 token, an unfinished prefill = its next
chunk), then waiting requests in arrival order, all under a token budget of
``max_num_batched_tokens`` and at most ``max_num_seqs`` running. KV memory is counted
in blocks of 16 tokens out of the planned pool; when a running request cannot get
the block it needs, the most recently admitted running request is preempted by
recompute (its blocks are freed, it goes back to the front of the waiting queue and
will prefill prompt + output so far again). A request samples one token each time all
its tokens are computed. Source: vLLM V1 ``vllm/v1/core/sched/scheduler.py``
(behaviour, not code); prefix caching is not simulated.

No clock here: :meth:`Scheduler.schedule` plans a step and returns its duration (s);
:meth:`Scheduler.complete` applies it at the step's end time.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Protocol

BLOCK = 16


class Sink(Protocol):
    """Receives a request's progress (called by :meth:`Scheduler.complete`)."""

    def on_token(self, req: "Request", t: float) -> None: ...

    def on_finish(self, req: "Request", t: float) -> None: ...


class Request:
    """One request. Token counts exact; times in rig seconds.

    ``eos_at``: output length at which the (simulated) model emits EOS (None = never,
    i.e. ``ignore_eos``); ``finish_reason`` ends as ``'length'``, ``'stop'`` or ``'abort'``.
    """

    __slots__ = ("rid", "prompt_len", "max_tokens", "eos_at", "arrival", "output", "computed", "blocks",
                 "first_scheduled", "first_token", "last_token", "finish_reason", "sink", "preemptions",
                 "running")

    def __init__(self, rid: str, prompt_len: int, max_tokens: int, arrival: float, eos_at: int | None = None,
                 sink: Sink | None = None) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.eos_at = eos_at
        self.arrival = arrival
        self.output = 0
        self.computed = 0
        self.blocks = 0
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish_reason: str | None = None
        self.sink = sink
        self.preemptions = 0
        self.running = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.output


@dataclass
class Step:
    """A planned step: ``work`` = [(request, new tokens)], duration ``dt`` (s) and its shape."""

    work: list
    dt: float
    decode_batch: int
    prefill_tokens: int
    preempted: int


StepTime = Callable[[int, float, int, float], float]


class Scheduler:
    """``num_blocks`` KV blocks of 16 tokens, ``max_num_seqs``, ``max_num_batched_tokens``;
    ``step_time(decode_batch, decode_context_sum, prefill_tokens, prefill_attention)`` → s,
    where ``prefill_attention`` = Σ over prefill chunks of n · (cached + n/2) (token ×
    context products: the attention work and KV reads of the chunks).
    ``on_finished(req, t)`` and ``on_first_token(req, t)`` are optional hooks (metrics)."""

    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, step_time: StepTime,
                 on_first_token: Callable[[Request, float], None] | None = None,
                 on_finished: Callable[[Request, float], None] | None = None,
                 on_token: Callable[[Request, float], None] | None = None) -> None:
        if num_blocks < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("num_blocks, max_num_seqs and max_num_batched_tokens must be >= 1")
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.step_time = step_time
        self.on_first_token = on_first_token
        self.on_finished = on_finished
        self.on_token = on_token
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prompt_tokens_done = 0
        self.generation_tokens = 0

    # ------------------------------------------------------------------ queue
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        """Drop a request (client went away): frees its blocks; no sink call."""
        if req.finish_reason is not None:
            return
        req.finish_reason = "abort"
        if req.running:
            self.running.remove(req)
            req.running = False
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.free_blocks += req.blocks
        req.blocks = 0

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (0–1), vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - self.free_blocks / self.num_blocks

    # ------------------------------------------------------------------ planning
    def _preempt_last(self) -> Request:
        victim = self.running.pop()
        victim.running = False
        self.free_blocks += victim.blocks
        victim.blocks = 0
        victim.computed = 0
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self, now: float) -> Step | None:
        """Plan one step at rig time ``now``; None when there is nothing to run."""
        budget = self.max_num_batched_tokens
        work: list = []
        preempted = 0
        dec_b = 0
        dec_ctx = 0
        pre_tok = 0
        pre_ctx = 0.0
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            r = running[i]
            need = r.prompt_len + r.output - r.computed
            n = need if need < budget else budget
            want = -(-(r.computed + n) // BLOCK) - r.blocks
            while want > self.free_blocks:
                victim = self._preempt_last()
                preempted += 1
                if victim is r:
                    break
            if not r.running:
                break  # r itself was preempted: nothing further fits
            if want > 0:
                self.free_blocks -= want
                r.blocks += want
            work.append((r, n))
            budget -= n
            if need == 1:
                dec_b += 1
                dec_ctx += r.computed
            else:
                pre_tok += n
                pre_ctx += n * (r.computed + n / 2)
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(running) < self.max_num_seqs:
                r = self.waiting[0]
                need = r.prompt_len + r.output - r.computed
                n = need if need < budget else budget
                want = -(-(r.computed + n) // BLOCK) - r.blocks
                if want > self.free_blocks:
                    break
                self.waiting.popleft()
                self.free_blocks -= want
                r.blocks += want
                r.running = True
                running.append(r)
                if r.first_scheduled is None:
                    r.first_scheduled = now
                work.append((r, n))
                budget -= n
                pre_tok += n
                pre_ctx += n * (r.computed + n / 2)
        if not work:
            return None
        dt = self.step_time(dec_b, float(dec_ctx), pre_tok, pre_ctx)
        return Step(work, dt, dec_b, pre_tok, preempted)

    # ------------------------------------------------------------------ applying
    def complete(self, step: Step, t: float) -> None:
        """Apply ``step`` at its end time ``t`` (rig s): advance computed tokens, sample
        tokens, finish requests (freeing their blocks) and call sinks/hooks."""
        finished = False
        for r, n in step.work:
            if not r.running:
                continue  # aborted meanwhile
            r.computed += n
            if r.computed < r.prompt_len + r.output:
                continue
            if r.first_token is None:
                r.first_token = t
                self.prompt_tokens_done += r.prompt_len
                if self.on_first_token:
                    self.on_first_token(r, t)
            elif self.on_token:
                self.on_token(r, t)
            r.output += 1
            r.last_token = t
            self.generation_tokens += 1
            if r.output >= r.max_tokens:
                r.finish_reason = "length"
            elif r.eos_at is not None and r.output >= r.eos_at:
                r.finish_reason = "stop"
            if r.sink is not None:
                r.sink.on_token(r, t)
            if r.finish_reason is not None:
                finished = True
                r.running = False
                self.free_blocks += r.blocks
                r.blocks = 0
                if self.on_finished:
                    self.on_finished(r, t)
                if r.sink is not None:
                    r.sink.on_finish(r, t)
        if finished:
            self.running = [r for r in self.running if r.running]
