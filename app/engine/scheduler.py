"""A continuous-batching scheduler shaped like vLLM V1's, in rig (simulated) time.

Each step: running requests first (decode = 1 token, an unfinished prefill = its next
chunk), then waiting requests in arrival order, all under a token budget of
``max_num_batched_tokens`` and at most ``max_num_seqs`` running. KV memory is counted
in blocks of 16 tokens out of the planned pool; when a running request cannot get
the block it needs, the most recently admitted running request is preempted by
recompute (its blocks are freed, it goes back to the front of the waiting queue and
will prefill prompt + output so far again). A request samples one token each time all
its tokens are computed. Source: vLLM V1 ``vllm/v1/core/sched/scheduler.py``
(behaviour, not code).

Prefix caching (``enable_prefix_caching``; vLLM V1's default is on:
vllm/config/cache.py ``enable_prefix_caching: bool = True``, 0.32.0), as vLLM's KV cache
manager (vllm/v1/core/kv_cache_manager.py, block_pool.py, 0.32.0): a request that
carries ``block_hashes`` (one chained hash per full block of its tokens,
:func:`block_hashes`) is looked up when it is admitted: its longest run of leading
blocks already cached is taken over — those tokens are not prefilled — capped at
``num_tokens − 1`` tokens (vLLM recomputes the last token for its logits:
``max_cache_hit_length``). Only full blocks are cached, each once it is computed (prompt
and output blocks alike); a finished, aborted or preempted request's blocks return to the
free pool but stay cached until a new allocation evicts them, least recently freed
first (a request's later blocks before its earlier ones, as vLLM frees them in reverse).
Deviation: fresh (never cached) free blocks are allocated before any cached free block
is evicted, where vLLM's single free queue mixes them by the time they were freed.
Queries and hits are counted in tokens for requests admitted for the first time
(``prefix_queries``, ``prefix_hits``: vLLM's ``PrefixCacheStats.record``, preempted
requests counted apart, vllm/v1/metrics/stats.py 0.32.0).

Speculative decoding (``spec_tokens`` = k > 0, vLLM's ``--speculative-config``
``num_speculative_tokens``): a decoding request is scheduled with its last token plus k
draft tokens (1 + k of the token budget and KV slots for all of them, as vLLM's
scheduler counts ``num_tokens_with_spec`` — vllm/v1/core/sched/scheduler.py, 0.32 — and
``KVCacheManager.allocate_slots`` reserves ``num_lookahead_tokens``, vllm/v1/core/
kv_cache_manager.py); at the
step's end ``accept(request, k)`` says how many drafts the target model accepted (a
leading run, 0…k) and the request emits 1 + accepted tokens at once — the accepted
drafts plus the target's own next token — in one output chunk (one sink call, as vLLM
streams a step's tokens in one delta). The KV of rejected drafts is discarded. Drafts
are capped so a request never passes ``max_tokens``. The counters ``spec_drafts``,
``spec_draft_tokens``, ``spec_accepted`` and ``spec_accepted_per_pos`` follow vLLM's
``SpecDecodingStats.observe_draft`` (vllm/v1/spec_decode/metrics.py, 0.32).

No clock here: :meth:`Scheduler.schedule` plans a step and returns its duration (s);
:meth:`Scheduler.complete` applies it at the step's end time. The engine loops (the
planner's :mod:`app.engine.offline` and the sim's :mod:`app.sim.engine`) drive it through
:meth:`Scheduler.advance` and :meth:`Scheduler.complete_due`, vLLM's engine-core loop.

Pipeline parallelism (``max_concurrent_batches`` P > 1, vLLM's
``VllmConfig.max_concurrent_batches`` = ``pipeline_parallel_size``: vllm/config/vllm.py:577,
0.32.0) — the batch queue of ``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py:220,
698–811): the engine schedules a new batch while earlier ones are still in the pipeline,
as long as fewer than P are in flight and the scheduler found work; when a schedule comes
back empty (every schedulable request is already in flight) or the queue is full, it
blocks on the oldest batch (empty schedules still take a queue slot, core.py:753: they
end as soon as the batch before them). New requests are seen only between those calls
(the busy loop reads its input queue between steps). The scheduler advances a request's
computed tokens when it schedules it (``_update_after_schedule``,
vllm/v1/core/sched/scheduler.py:1616), so the next chunk of a prompt can go into the very
next batch, while a request that has scheduled all its tokens has nothing new to schedule
(``num_new_tokens == 0``, "PP>1 and we have already scheduled all prompt tokens but they
are not finished yet", scheduler.py:755) until its batch's output comes back: a decoding
request is in at most one batch in flight. (The V2 model runner's async scheduling, P + 1
batches, spaces a request's decodes ``pipeline_parallel_size`` steps apart —
``next_decode_eligible_step``, vllm/v1/core/sched/async_scheduler.py:51 — the same cadence.)
A batch starts when the first stage is free — its predecessor's start + its stage time
(the step time's ``interval``) — and ends its full pipeline latency (``dt``) later, after
the batch before it (outputs return in order), all in rig time. The scheduler
counts in-flight tokens (``Request.inflight``) instead of advancing ``computed`` early.
Deviation: a request preempted while in flight may be admitted again at once (its stale
output is dropped), where vLLM waits for the stale output to drain (scheduler.py:933).

Prefill first (``prefill_first``): the V0 engine's scheduling without chunked prefill
(``Scheduler._schedule_default``, vllm/core/scheduler.py, the same from 0.4 to 0.7 — the
default engine before 0.8; chunked prefill off there unless ``max_model_len`` > 32K or
asked for, :func:`app.planner.versions.chunked_prefill_default`): waiting prompts are
scheduled first, whole (prompt, or prompt + output so far after a preemption), under the
token budget, ``max_num_seqs`` and the free blocks; a step that admits any is a prefill
step of those prompts only — "Don't schedule decodes if prefills are scheduled" — and only
a step that admits none decodes every running request. So each arrival stalls every
decode for one forward pass of its own, which a loaded V0 server pays about once per
finished request. A prompt longer than the whole budget goes alone (vLLM ignores it
with a warning; the planner's checks refuse such a configuration). Deviation: the prefix
cache is not looked up in this mode (V0 leaves it off unless ``--enable-prefix-caching``).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Hashable, Protocol, Sequence

from app.engine.kvcache import KvCacheLayout

BLOCK = 16


def block_hashes(tokens: Sequence[Hashable], block: int = BLOCK, parent: Hashable = None) -> list[int]:
    """One hash per full block of ``block`` tokens, each chained to the one before (as
    vLLM's ``hash_block_tokens``: a block's identity is its tokens and all the tokens
    before it); a trailing partial block gets none. ``tokens``: any hashable token
    identities (ids or strings); ``parent``: the hash before the first block (e.g. a
    LoRA or a salt). Hashes are Python's (stable within one process, which is the
    cache's lifetime)."""
    out: list[int] = []
    h = hash(("dyno-prefix", parent))
    for i in range(0, len(tokens) - block + 1, block):
        h = hash((h, tuple(tokens[i:i + block])))
        out.append(h)
    return out


class Sink(Protocol):
    """Receives a request's progress (called by :meth:`Scheduler.complete`): ``on_token``
    once per output chunk — one token, or 1 + accepted drafts with speculative decoding;
    ``req.output`` is the output length after it."""

    def on_token(self, req: "Request", t: float) -> None: ...

    def on_finish(self, req: "Request", t: float) -> None: ...


class Request:
    """One request. Token counts exact; times in rig seconds.

    ``eos_at``: output length at which the (simulated) model emits EOS (None = never,
    i.e. ``ignore_eos``); ``finish_reason`` ends as ``'length'``, ``'stop'`` or ``'abort'``.
    """

    __slots__ = ("rid", "prompt_len", "max_tokens", "eos_at", "arrival", "output", "computed", "blocks",
                 "first_scheduled", "first_token", "last_token", "finish_reason", "sink", "preemptions",
                 "running", "block_hashes", "held", "n_hashed", "cached_tokens", "inflight")

    def __init__(self, rid: str, prompt_len: int, max_tokens: int, arrival: float, eos_at: int | None = None,
                 sink: Sink | None = None, block_hashes: Sequence[Hashable] | None = None) -> None:
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
        #: the hashes of its full blocks, prompt then output (:func:`block_hashes`); None: not cacheable
        self.block_hashes = block_hashes
        self.held: list = []  # hashes of the cached blocks it holds a reference to
        self.n_hashed = 0  # its leading blocks already looked at for caching
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache at its (first) admission
        self.inflight = 0  # tokens scheduled in batches still in the pipeline (pipeline parallelism)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.output


@dataclass
class Step:
    """A planned step: ``work`` = [(request, new tokens)], duration ``dt`` (s: its pass
    through every pipeline stage) and its shape; ``drafts``: the draft tokens verified per
    decoding request (speculative decoding); ``interval``: the time its slowest pipeline
    stage is busy with it, s (the next batch can start that long after it; ``dt`` with one
    stage); ``start``/``end``: rig s, set by :meth:`Scheduler.advance`; ``stale``:
    requests preempted while it was in flight (their work is dropped)."""

    work: list
    dt: float
    decode_batch: int
    prefill_tokens: int
    preempted: int
    drafts: dict | None = None
    interval: float = 0.0
    start: float = 0.0
    end: float = 0.0
    stale: set | None = None


#: (decode batch, decode context sum, prefill tokens, prefill attention[, draft tokens]) → s,
#: or → (s through every pipeline stage, s of the slowest stage) with pipeline parallelism
#: (:meth:`app.engine.steptime.StepTimeModel.pipeline_step_time`); the fifth argument is
#: passed only with speculative decoding
StepTime = Callable[..., "float | tuple[float, float]"]
#: (request, drafts k) → drafts accepted, 0…k
Accept = Callable[["Request", int], int]


class Scheduler:
    """``num_blocks`` KV blocks of 16 tokens, ``max_num_seqs``, ``max_num_batched_tokens``;
    ``step_time(decode_batch, decode_context_sum, prefill_tokens, prefill_attention)`` → s,
    where ``prefill_attention`` = Σ over prefill chunks of n · (cached + n/2) (token ×
    context products: the attention work and KV reads of the chunks).
    ``on_finished(req, t)`` and ``on_first_token(req, t)`` are optional hooks (metrics);
    ``on_token(req, t)`` once per later output chunk. ``spec_tokens`` k and ``accept``:
    speculative decoding (module docstring); ``step_time`` then also gets the step's draft
    tokens (Σ k over the decoding requests) as a fifth argument. ``enable_prefix_caching``:
    requests with ``block_hashes`` reuse cached full blocks (module docstring).
    ``max_concurrent_batches``: batches in flight at once, vLLM's
    ``max_concurrent_batches`` (= ``pipeline_parallel_size``; module docstring).
    ``kv_layout``: a hybrid model's KV cache groups (sliding-window, chunked, mamba
    layers: :mod:`app.engine.kvcache`); ``num_blocks`` then counts the pool's blocks.
    ``max_num_active_seqs``: vLLM's ``--max-num-active-seqs`` (0.31+), the requests admitted
    into RUNNING when below ``max_num_seqs`` (vllm/v1/core/sched/scheduler.py:132–136, :923
    @ 0.32.0: the waiting loop stops at ``len(running) >= max_num_active_reqs``; None:
    ``max_num_seqs``).
    ``prefill_first``: the V0 engine's steps of whole prompts only, before any decode
    (module docstring)."""

    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, step_time: StepTime,
                 on_first_token: Callable[[Request, float], None] | None = None,
                 on_finished: Callable[[Request, float], None] | None = None,
                 on_token: Callable[[Request, float], None] | None = None, spec_tokens: int = 0,
                 accept: Accept | None = None, enable_prefix_caching: bool = False,
                 max_concurrent_batches: int = 1, kv_layout: KvCacheLayout | None = None,
                 max_num_active_seqs: int | None = None, prefill_first: bool = False) -> None:
        if num_blocks < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1 or max_concurrent_batches < 1:
            raise ValueError("num_blocks, max_num_seqs, max_num_batched_tokens and max_concurrent_batches "
                             "must be >= 1")
        self.max_concurrent_batches = max_concurrent_batches
        #: V0's scheduling without chunked prefill (module docstring)
        self.prefill_first = prefill_first
        #: the batch queue: steps scheduled and not yet completed, oldest first (empty schedules: None work)
        self.batches: collections.deque[Step] = collections.deque()
        self._front_free = 0.0  # rig s the first pipeline stage is free for the next batch
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        #: the admission cap into RUNNING (vLLM's max_num_active_reqs)
        self.max_num_active = min(max_num_seqs, max_num_active_seqs) if max_num_active_seqs else max_num_seqs
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
        if spec_tokens < 0 or (spec_tokens and accept is None):
            raise ValueError("spec_tokens must be >= 0, and speculative decoding needs an accept function")
        self.spec_tokens = spec_tokens
        self.accept = accept
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_accepted_per_pos = [0] * spec_tokens
        #: hybrid KV cache groups (app.engine.kvcache; None: one full-attention group of BLOCK-token
        #: blocks): ``num_blocks`` are then the pool's blocks and a request holds
        #: ``kv_layout.held_blocks(computed, new)`` of them — only its window in a sliding or
        #: chunked group. Deviation: the prefix cache is not modelled for such a model.
        self.kv_layout = kv_layout if kv_layout is not None and not kv_layout.uniform else None
        self.enable_prefix_caching = enable_prefix_caching and self.kv_layout is None
        self.cache: dict = {}  # block hash → requests holding it (0: free, evictable)
        self.free_cached: collections.OrderedDict = collections.OrderedDict()  # free cached blocks, LRU first
        self.prefix_queries = 0  # tokens looked up (requests admitted for the first time)
        self.prefix_hits = 0  # of them, tokens found cached

    # ------------------------------------------------------------------ KV blocks
    def _alloc(self, n: int) -> None:
        """Take ``n`` free blocks: fresh ones first, then the least recently freed cached
        ones (evicted from the cache). The caller checked ``n <= free_blocks``."""
        fresh = self.free_blocks - len(self.free_cached)
        self.free_blocks -= n
        for _ in range(n - fresh if n > fresh else 0):
            h, _ = self.free_cached.popitem(last=False)
            del self.cache[h]

    def _release(self, r: Request) -> None:
        """``r`` gives back its blocks (finished, aborted or preempted). ``r.blocks``
        counts every block it references: its own uncached ones, freed at once, and the
        cached ones it holds (``r.held``, reference-counted as vLLM's ``KVCacheBlock.ref_cnt``):
        such a block is free — and stays cached, evictable, its last block first in line —
        only once no other request holds it (a block shared by two requests is one block,
        freed once)."""
        freed = r.blocks - len(r.held)
        r.blocks = 0
        for h in reversed(r.held):
            c = self.cache[h] - 1
            self.cache[h] = c
            if c == 0:
                self.free_cached[h] = None
                freed += 1
        self.free_blocks += freed
        r.held = []
        r.n_hashed = 0

    def _lookup(self, r: Request) -> list:
        """The hashes of ``r``'s leading blocks found cached (at most ``num_tokens − 1``
        tokens' worth, vLLM's ``max_cache_hit_length``)."""
        hs = r.block_hashes
        if not self.enable_prefix_caching or not hs:
            return []
        cap = (r.prompt_len + r.output - 1) // BLOCK
        hit = []
        for h in hs[:cap]:
            if h not in self.cache:
                break
            hit.append(h)
        return hit

    def _cache_computed(self, r: Request) -> None:
        """Cache ``r``'s blocks that became full and computed (a block another request
        cached first stays ``r``'s own, uncached, as in vLLM)."""
        hs = r.block_hashes
        if hs is None:  # no hashes: nothing to cache (the caller checks)
            return
        full = min(r.computed // BLOCK, len(hs))
        cache = self.cache
        for i in range(r.n_hashed, full):
            h = hs[i]
            if h not in cache:
                cache[h] = 1
                r.held.append(h)
        r.n_hashed = r.computed // BLOCK  # blocks past its hashes (none given) are not looked at again

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
        self._release(req)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``BlockPool.reset_prefix_cache``,
        vllm/v1/core/block_pool.py @ 0.32.0): refused (False) while any block is held by a
        request — vLLM logs "Failed to reset prefix cache because some blocks (N) are not
        freed yet" and answers ``{"success": false}``; True once the cache is empty. The
        counters (``prefix_queries``/``prefix_hits``) go on counting, as vLLM's do."""
        if self.free_blocks != self.num_blocks:
            return False
        self.cache.clear()
        self.free_cached.clear()
        return True

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (0–1), vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - self.free_blocks / self.num_blocks

    # ------------------------------------------------------------------ planning
    def _preempt_last(self) -> Request:
        victim = self.running.pop()
        victim.running = False
        self._release(victim)
        victim.computed = 0
        if victim.inflight:  # its work in the batches still in flight is dropped when they end
            victim.inflight = 0
            for b in self.batches:
                if any(r is victim for r, _ in b.work):
                    b.stale = (b.stale or set()) | {victim}
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _admit(self, r: Request, want: int, n: int, now: float, work: list) -> None:
        """Waiting request ``r`` into RUNNING with ``want`` more blocks and ``n`` tokens in
        this step's ``work`` (both scheduling modes)."""
        self._alloc(want)
        r.blocks += want
        r.running = True
        self.running.append(r)
        if r.first_scheduled is None:
            r.first_scheduled = now
        work.append((r, n))

    def _schedule_prefills_first(self, now: float) -> Step | None:
        """V0's prefill step (module docstring): whole waiting prompts in order while the
        budget, ``max_num_seqs`` and the free blocks allow; None when none is admitted."""
        budget = self.max_num_batched_tokens
        work: list = []
        pre_tok, pre_ctx = 0, 0.0
        running = self.running
        while self.waiting and len(running) < self.max_num_seqs:
            r = self.waiting[0]
            need = r.prompt_len + r.output - r.computed
            if need > budget and work:
                break
            want = (-(-(r.computed + need) // BLOCK) - r.blocks if self.kv_layout is None
                    else self.kv_layout.held_blocks(r.computed, need) - r.blocks)
            if want > self.free_blocks:
                break
            self.waiting.popleft()
            self._admit(r, want, need, now, work)
            budget -= need
            pre_tok += need
            pre_ctx += need * (r.computed + need / 2)
        if not work:
            return None
        dt = self.step_time(0, 0.0, pre_tok, pre_ctx) if not self.spec_tokens else \
            self.step_time(0, 0.0, pre_tok, pre_ctx, 0)
        dt, interval = dt if isinstance(dt, tuple) else (dt, dt)
        if self.max_concurrent_batches > 1:
            for r, n in work:
                r.inflight += n
        return Step(work, dt, 0, pre_tok, 0, {} if self.spec_tokens else None, interval)

    def schedule(self, now: float) -> Step | None:
        """Plan one step at rig time ``now``; None when there is nothing to run."""
        if self.prefill_first and self.waiting:
            step = self._schedule_prefills_first(now)
            if step is not None:
                return step
        budget = self.max_num_batched_tokens
        work: list = []
        preempted = 0
        dec_b = 0
        dec_ctx = 0
        pre_tok = 0
        pre_ctx = 0.0
        i = 0
        running = self.running
        drafts: dict | None = {} if self.spec_tokens else None
        spec_tok = 0
        while i < len(running) and budget > 0:
            r = running[i]
            need = r.prompt_len + r.output - r.computed - r.inflight
            if need <= 0:  # all its tokens are in flight (pipeline parallelism): vLLM's num_new_tokens == 0
                i += 1
                continue
            k = 0
            if need == 1 and drafts is not None:  # decoding: verify k drafts with the last token
                k = max(0, min(self.spec_tokens, r.max_tokens - r.output - 1, budget - 1))
                need += k
            n = need if need < budget else budget
            if self.kv_layout is None:
                want = -(-(r.computed + r.inflight + n) // BLOCK) - r.blocks
            else:
                want = self.kv_layout.held_blocks(r.computed, r.inflight + n) - r.blocks
                if want < 0:  # blocks left of a window are freed (remove_skipped_blocks)
                    self.free_blocks -= want
                    r.blocks += want
                    want = 0
            while want > self.free_blocks:
                victim = self._preempt_last()
                preempted += 1
                if victim is r:
                    break
            if not r.running:
                break  # r itself was preempted: nothing further fits
            if want > 0:
                self._alloc(want)
                r.blocks += want
            work.append((r, n))
            budget -= n
            if k and drafts is not None:  # k > 0 only with drafts
                drafts[r] = k
                spec_tok += k
                dec_b += 1
                dec_ctx += r.computed
            elif need == 1:
                dec_b += 1
                dec_ctx += r.computed
            else:
                pre_tok += n
                pre_ctx += n * (r.computed + r.inflight + n / 2)
            i += 1
        if not preempted and not self.prefill_first:
            while self.waiting and budget > 0 and len(running) < self.max_num_active:
                r = self.waiting[0]
                hit = self._lookup(r) if r.computed == 0 else []
                computed = len(hit) * BLOCK if hit else r.computed
                need = r.prompt_len + r.output - computed
                n = need if need < budget else budget
                want = (-(-(computed + n) // BLOCK) - r.blocks - len(hit) if self.kv_layout is None
                        else self.kv_layout.held_blocks(computed, n) - r.blocks)
                revived = sum(1 for h in hit if self.cache[h] == 0)  # free cached blocks it takes back
                if want + revived > self.free_blocks:
                    break
                self.waiting.popleft()
                if r.block_hashes and self.enable_prefix_caching and r.computed == 0:
                    for h in hit:
                        if self.cache[h] == 0:
                            del self.free_cached[h]
                            self.free_blocks -= 1
                        self.cache[h] += 1
                    r.held = list(hit)
                    r.n_hashed = len(hit)
                    r.blocks += len(hit)
                    r.computed = computed
                    if r.preemptions == 0:
                        self.prefix_queries += r.prompt_len
                        self.prefix_hits += computed
                        r.cached_tokens = computed
                self._admit(r, want, n, now, work)
                budget -= n
                pre_tok += n
                pre_ctx += n * (r.computed + n / 2)
        if not work:
            return None
        if drafts is None:
            dt = self.step_time(dec_b, float(dec_ctx), pre_tok, pre_ctx)
        else:
            dt = self.step_time(dec_b, float(dec_ctx), pre_tok, pre_ctx, spec_tok)
        dt, interval = dt if isinstance(dt, tuple) else (dt, dt)
        if self.max_concurrent_batches > 1:
            for r, n in work:
                r.inflight += n
        return Step(work, dt, dec_b, pre_tok, preempted, drafts, interval)

    # ------------------------------------------------------------------ the engine loop
    @property
    def next_due(self) -> float | None:
        """Rig s the oldest batch in flight ends — the engine is blocked on it until then —
        or None when nothing is in flight (the engine waits for a request)."""
        return self.batches[0].end if self.batches else None

    def complete_due(self, now: float) -> Step | None:
        """The oldest batch in flight, if it has ended by ``now`` (rig s): taken off the
        queue and applied (:meth:`complete`) at its end time; None otherwise or when it
        was an empty schedule."""
        if not self.batches or self.batches[0].end > now:
            return None
        b = self.batches.popleft()
        if not b.work:
            return None
        self.complete(b, b.end)
        return b

    def _push(self, step: Step | None, now: float) -> None:
        last = self.batches[-1].end if self.batches else now
        if step is None:  # an empty schedule: it ends as the batch before it does
            self.batches.append(Step([], 0.0, 0, 0, 0, start=now, end=max(now, last)))
            return
        step.start = max(now, self._front_free)
        step.end = max(step.start + step.dt, last)
        self._front_free = step.start + step.interval
        self.batches.append(step)

    def advance(self, now: float) -> list[Step]:
        """Run the engine-core loop at rig time ``now`` (``EngineCore.step_with_batch_queue``,
        vllm/v1/engine/core.py:698, 0.32.0): schedule batches while the queue has room and
        the scheduler finds work — an empty schedule fills the queue and blocks —, take
        off the oldest batches that have ended by ``now`` in between; stop when blocked on
        a batch that ends later (:attr:`next_due`) or idle. Call it when a request arrives
        at an idle engine or after :meth:`complete_due`; returns the batches it completed
        (oldest first). With one batch at a time this is schedule, then wait for the step."""
        done: list[Step] = []
        q, depth = self.batches, self.max_concurrent_batches
        while True:
            if self.has_work and len(q) < depth:
                step = self.schedule(now)
                if step is None and not any(b.work for b in q):
                    q.clear()  # nothing can run (only ended empty schedules left): idle
                    return done
                self._push(step, now)
                if step is not None and len(q) < depth:
                    continue
                while step is None and len(q) < depth:  # vLLM schedules empties until the queue is full
                    self._push(None, now)
            elif not q:
                return done
            if q[0].end > now:
                return done
            b = self.complete_due(now)
            if b is not None:
                done.append(b)

    # ------------------------------------------------------------------ applying
    def complete(self, step: Step, t: float) -> None:
        """Apply ``step`` at its end time ``t`` (rig s): advance computed tokens, sample
        tokens, finish requests (freeing their blocks) and call sinks/hooks."""
        finished = False
        drafts = step.drafts
        stale = step.stale
        pp = self.max_concurrent_batches > 1
        for r, n in step.work:
            if not r.running or (stale and r in stale):
                continue  # aborted meanwhile, or preempted while in flight
            if pp:
                r.inflight -= n
            emit = 1
            k = drafts.get(r, 0) if drafts else 0
            if k:
                a = self._verify(r, k)
                r.computed += n - k + a  # the rejected drafts' KV is discarded
                emit += a
            else:
                r.computed += n
            if r.computed >= (r.n_hashed + 1) * BLOCK and r.block_hashes and self.enable_prefix_caching:
                self._cache_computed(r)  # a block became full
            if r.computed < r.prompt_len + r.output:
                continue
            if r.first_token is None:
                r.first_token = t
                self.prompt_tokens_done += r.prompt_len
                if self.on_first_token:
                    self.on_first_token(r, t)
            elif self.on_token:
                self.on_token(r, t)
            if r.eos_at is not None and r.output + emit > r.eos_at > r.output:
                emit = r.eos_at - r.output  # EOS among the accepted tokens ends the chunk there
            r.output += emit
            r.last_token = t
            self.generation_tokens += emit
            if r.output >= r.max_tokens:
                r.finish_reason = "length"
            elif r.eos_at is not None and r.output >= r.eos_at:
                r.finish_reason = "stop"
            if r.sink is not None:
                r.sink.on_token(r, t)
            if r.finish_reason is not None:
                finished = True
                r.running = False
                self._release(r)
                if self.on_finished:
                    self.on_finished(r, t)
                if r.sink is not None:
                    r.sink.on_finish(r, t)
        if finished:
            self.running = [r for r in self.running if r.running]

    def _verify(self, r: Request, k: int) -> int:
        """Drafts of ``r`` accepted out of ``k`` (``accept``), counted as vLLM's
        ``SpecDecodingStats.observe_draft`` does: one draft, k draft tokens, the accepted
        ones, and one per position below the accepted count."""
        accept = self.accept
        assert accept is not None  # speculative decoding needs one (__init__)
        a = max(0, min(k, int(accept(r, k))))
        self.spec_drafts += 1
        self.spec_draft_tokens += k
        self.spec_accepted += a
        for i in range(a):
            self.spec_accepted_per_pos[i] += 1
        return a
