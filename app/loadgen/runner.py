"""The ramp itself, in asyncio: closed-loop concurrency levels or open-loop request rates
(Poisson, or gamma with a burstiness: :mod:`app.loadgen.arrivals`).

This runs inside the load-generator process (:mod:`app.loadgen.worker`); it reports
through two plain callables: ``emit_record(RequestRecord)`` for every finished request
and ``emit_event(dict)`` for ``preflight``, ``level_start``, ``level_end`` (with the
level's StepStats as a dict) and ``done``. One :class:`aiohttp.ClientSession` serves the
whole ramp; its connector allows at least the largest level at once (aiohttp's
default of 100 would silently cap concurrency).

Each level also reads the server's ``/metrics`` at the start and the end of its
measuring window (the exact instants: only this process knows them) and carries the
server's figures over it as ``StepStats.server`` (:mod:`app.loadgen.server_stats`);
before each level it resets the server's prefix cache (``POST /reset_prefix_cache``,
vLLM with ``VLLM_SERVER_DEV_MODE=1``) when the server offers it, so a level does not
hit what the level before it cached.
Multi-turn ramps (``RampSpec.multi_turn``): a closed-loop level of N is N users each
holding a conversation (:class:`app.loadgen.prompts.Conversation`): a user sends a turn,
waits for its reply, thinks (exponential, mean ``think_s``; ``Random`` seeded by the
ramp's seed, the level and the user) and sends the next turn with the history and the
reply as received; after its last turn it starts a new conversation at once. A thinking
user holds no request in flight, so a level's N counts conversations in progress and its
requests in flight are at most N (``max_in_flight`` says how many were). Conversations
do not carry over from one level to the next (each level's users start afresh).

Admission control (vLLM's ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``): a request
the server refuses with HTTP 503 is recorded as ``rejected`` (app.loadgen.records), not
as a failure — it never counts towards the failure-rate stop, nor against a level's
request quota or its settling; its closed-loop user waits (the answer's ``Retry-After``,
else :attr:`RampSpec.retry_wait_s`: the think time, else ``rejected_wait_s``, 1 s) and
sends the same request again. An open-loop arrival that is refused is not sent again.
"""
from __future__ import annotations

import asyncio
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp

from app.loadgen.capacity import level_decided, level_met, search_levels
from app.loadgen.client import preflight, stream_request, tokens_per_word
from app.loadgen.prompts import RequestFactory, calibration_sample, needs_calibration
from app.loadgen.records import RequestRecord
from app.loadgen.server_stats import client_tokens, server_window
from app.loadgen.spec import RampSpec
from app.loadgen.stats import StepStats, compute_step_stats, find_knee, level_window, slo_stop_reason
from app.telemetry.metrics_parse import MetricsParseError, parse_metrics

#: pause after a failed request before a closed-loop slot retries (a dead server
#: refuses connections in microseconds; without it a slot would spin)
FAIL_BACKOFF_S = 0.02
#: seconds one /metrics reading or prefix-cache reset may take
SERVER_HTTP_TIMEOUT_S = 5.0


def auth_headers() -> dict:
    """``Authorization`` header from ``VLLM_API_KEY``/``OPENAI_API_KEY`` (never argv)."""
    key = os.environ.get("DYNO_API_KEY") or os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class _LevelState:
    """Where a level of :meth:`Ramp._level` is: why it stopped sending (None: not yet), the
    requests counted after the warm-up (``issued``) and ended (``done``), and when the last
    request sent after the warm-up ended (session clock)."""

    reason: str | None = None
    issued: int = 0
    done: int = 0
    last_measured_end: float | None = None


class Ramp:
    """Run one RampSpec. ``t0``: session-clock origin (a ``time.monotonic()`` value).

    ``abort``: an :class:`asyncio.Event`; when set, the ramp stops at once (in-flight
    requests are cancelled; finished ones were already emitted). :meth:`run` returns
    the ``done`` event dict. Raises :class:`PreflightError` before any load.
    """

    def __init__(self, spec: RampSpec, emit_record: Callable[[RequestRecord], None],
                 emit_event: Callable[[dict], None], t0: float, abort: asyncio.Event | None = None) -> None:
        self.spec = spec
        self.emit_record = emit_record
        self.emit_event = emit_event
        self.t0 = t0
        self.abort = abort or asyncio.Event()
        #: why the ramp was aborted, when not by the app (a SIGTERM to the process); None: "aborted"
        self.abort_reason: str | None = None
        self.steps: list[StepStats] = []
        self.in_flight = 0
        self.max_in_flight = 0
        #: whether the server serves /metrics (None: not tried yet) and why not
        self.metrics_ok: bool | None = None
        self.metrics_problem: str | None = None
        #: whether the server offers POST /reset_prefix_cache (None: not tried yet)
        self.reset_ok: bool | None = None

    def rel(self, t: float) -> float:
        return t - self.t0

    async def run(self) -> dict:
        spec = self.spec
        headers = auth_headers()
        limit = spec.largest_level + 16
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, ttl_dns_cache=None)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                         headers={"Content-Type": "application/json", **headers},
                                         read_bufsize=1 << 18) as session:
            self.session = session
            model, entry = await preflight(session, spec.url, spec.model, headers)
            tpw = None
            if needs_calibration(spec):  # synthetic words: scaled to the model's tokens
                tpw = await tokens_per_word(session, spec.url, model, calibration_sample(), headers)
            self.emit_event({"type": "preflight", "model": model, "max_model_len": entry.get("max_model_len"),
                             "connector_limit": connector.limit, "tokens_per_word": tpw,
                             "t": self.rel(time.monotonic())})
            self.url = spec.url + spec.endpoint
            mml = entry.get("max_model_len")
            self.factory = RequestFactory(spec, model, tokens_per_word=tpw,
                                          max_model_len=mml if isinstance(mml, int) and mml > 0 else None)
            self.req_timeout = aiohttp.ClientTimeout(total=spec.request_timeout, sock_connect=min(10.0, spec.request_timeout))
            self.ramp_start = time.monotonic()
            status, reason = "done", "all levels done"
            judged: list[tuple[int, float, bool]] = []  # a capacity search's (repeat, level, met)
            idx = 0
            while True:
                repeat = 0
                if spec.search is not None:
                    nxt = search_levels(spec.search, judged, spec.mode)
                    if nxt is None:
                        reason = "capacity search done"
                        break
                    repeat, level = nxt
                elif idx < len(spec.level_values):
                    level = spec.level_values[idx]
                else:
                    break
                if self.abort.is_set():
                    status, reason = "aborted", self.abort_reason or "aborted"
                    break
                if self._cap_left() <= 0:
                    status, reason = "stopped", f"max_total_seconds {spec.max_total_seconds:g} s reached"
                    break
                st = await self._level(idx, level)
                st.repeat = repeat
                idx += 1
                self.steps.append(st)
                self.emit_event({"type": "level_end", "stats": st.model_dump(mode="json")})
                if st.stop_reason == "aborted":
                    status, reason = "aborted", self.abort_reason or "aborted"
                    break
                if spec.search is not None and st.stop_reason != "total_cap":
                    # a search judges the level and goes on: breaking the SLO is its answer
                    judged.append((repeat, level, level_met(st, spec.slo)))
                    continue
                if st.stop_reason == "failure_rate":
                    kinds = ", ".join(f"{k} {v}" for k, v in sorted(st.failures.items())) or "none measured"
                    status, reason = "failed", (f"level {level:g}: failure rate passed {spec.max_failure_rate:.0%} "
                                                f"(failures: {kinds}); ramp stopped")
                    break
                if st.stop_reason == "total_cap":
                    status, reason = "stopped", f"max_total_seconds {spec.max_total_seconds:g} s reached"
                    break
                if st.slo_broken:
                    status, reason = "slo_broken", slo_stop_reason(st)
                    break
        knee = find_knee(self.steps, spec.knee_gain, spec.knee_ttft_ratio)
        done = {"type": "done", "status": status, "stop_reason": reason,
                "knee": knee.model_dump(mode="json") if knee else None, "t": self.rel(time.monotonic())}
        self.emit_event(done)
        return done

    async def _scrape(self, at: float | None = None) -> tuple[float, str] | None:
        """``(session-clock instant, text)`` of one ``/metrics`` reading taken at monotonic
        time ``at`` (now when None or past); the instant is the middle of the request.
        None when the server has no ``/metrics`` (remembered: not asked again)."""
        if at is not None and at > time.monotonic():
            await asyncio.sleep(at - time.monotonic())
        if self.metrics_ok is False:
            return None
        t_a = time.monotonic()
        try:
            async with self.session.get(self.spec.url + "/metrics",
                                        timeout=aiohttp.ClientTimeout(total=SERVER_HTTP_TIMEOUT_S)) as resp:
                text = await resp.text()
                if resp.status != 200 or "vllm:" not in text:
                    self.metrics_ok = False
                    self.metrics_problem = f"GET /metrics: HTTP {resp.status}" + ("" if resp.status != 200
                                                                                 else ", no vllm: series")
                    return None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            self.metrics_problem = f"GET /metrics: {type(e).__name__}: {e}"
            return None
        self.metrics_ok = True
        return self.rel((t_a + time.monotonic()) / 2), text

    async def _reset_prefix_cache(self) -> bool | None:
        """``POST /reset_prefix_cache`` (vLLM dev mode; docs/vllm-facts.md): True when the
        server reset it, False when it answered that it could not (0.32+: ``{"success":
        false}`` while blocks are held), None when it does not offer it (remembered)."""
        if self.reset_ok is False or self.metrics_ok is False:
            return None
        try:
            async with self.session.post(self.spec.url + "/reset_prefix_cache",
                                         timeout=aiohttp.ClientTimeout(total=SERVER_HTTP_TIMEOUT_S)) as resp:
                body = await resp.text()
                if resp.status in (401, 403, 404, 405, 501):  # not there (no dev mode), or not for us
                    self.reset_ok = False
                    return None
                if resp.status != 200:
                    return False
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return None
        self.reset_ok = True
        return '"success":false' not in body.replace(" ", "")

    async def _server_stats(self, st: StepStats, first: "asyncio.Task | None", last: "asyncio.Task | None",
                            recs: list[RequestRecord], reset: bool | None) -> None:
        """Attach the server's figures over the window to ``st`` (``first``/``last``: the
        two :meth:`_scrape` tasks); leaves ``st.server`` None when either reading failed."""
        try:
            a = await first if first is not None else None
            b = await last if last is not None else None
            if a is None or b is None:
                st.server_problem = self.metrics_problem or "GET /metrics failed"
                return
            before, after = await asyncio.to_thread(lambda: (parse_metrics(a[1]), parse_metrics(b[1])))
            sv = server_window(before, after, scrape_start=a[0], scrape_end=b[0], prefix_cache_reset=reset)
            sv.client_prompt_tokens, sv.client_output_tokens = client_tokens(recs, a[0], b[0])
        except MetricsParseError as e:
            st.server_problem = self.metrics_problem = f"GET /metrics: {e}"
            return
        except Exception as e:  # the level's own figures must never be lost to the server's
            st.server_problem = f"server figures: {type(e).__name__}: {e}"
            return
        st.server = sv  # its notes (explain) are written in rig seconds, by whoever converts the level

    def _cap_left(self) -> float:
        if self.spec.max_total_seconds is None:
            return math.inf
        return self.ramp_start + self.spec.max_total_seconds - time.monotonic()

    async def _level(self, idx: int, level: float) -> StepStats:
        spec = self.spec
        recs: list[RequestRecord] = []
        self.in_flight = self.max_in_flight = 0
        reset = await self._reset_prefix_cache()
        if reset is False:  # 0.32 refuses while blocks are held (a cancelled request's): once more
            await asyncio.sleep(0.5)
            reset = await self._reset_prefix_cache()
        t_level = time.monotonic()
        step = spec.step_seconds if spec.step_seconds is not None else math.inf
        # a closed-loop level settles once each user has finished one request: the first
        # requests of a level go out together (the previous level drained), and their
        # prefills queue behind each other — a start-up burst, not the level's steady state
        settle_n = int(level) if spec.settles and spec.mode == "concurrency" else 0
        settled = asyncio.Event()
        win = {"w0": t_level + spec.warmup_seconds}
        scrapes: dict[str, asyncio.Task] = {}  # the /metrics readings at the window's edges
        if settle_n:
            win["w0"] = math.inf
        else:
            settled.set()
            scrapes["first"] = asyncio.create_task(self._scrape(win["w0"]))
        win["deadline"] = win["w0"] + step
        cap = self.ramp_start + spec.max_total_seconds if spec.max_total_seconds else math.inf
        stop = asyncio.Event()
        state = _LevelState()

        def settle(now: float) -> None:
            """End the warm-up: at ``now``, or ``warmup_seconds`` after the level began if later."""
            win["w0"] = max(now, t_level + spec.warmup_seconds)
            win["deadline"] = win["w0"] + step
            settled.set()
            scrapes["first"] = asyncio.create_task(self._scrape(win["w0"]))
        quota = spec.level_quota(level)
        # a search level stops sending once its verdict is decided (app.loadgen.capacity.level_decided)
        decide = spec.search is not None and quota is not None
        measured: list[RequestRecord] = []
        self.emit_event({"type": "level_start", "idx": idx, "level": level, "mode": spec.mode,
                         "t": self.rel(t_level), "settles": bool(settle_n)})

        def may_issue() -> bool:
            """Account for one more request; False when the level should stop sending."""
            if stop.is_set():
                return False
            if quota is not None and time.monotonic() >= win["w0"]:
                if state.issued >= quota:
                    state.reason = state.reason or "count"
                    stop.set()
                    return False
                state.issued += 1
            return True

        async def one(conv: dict | None = None, again: tuple | None = None) -> RequestRecord:
            """Send one request; ``conv`` (multi-turn): ``{"c": Conversation or None}``, the
            user's conversation, advanced by this turn (None after a failed turn: the
            user starts a new one). ``again``: ``(body, est)`` of a refused request, sent
            again as it was (the record's ``again`` attribute holds it after a refusal)."""
            text: list[str] | None = None
            if again is not None:
                body, est = again
                text = [] if conv is not None else None
            elif conv is None:
                body, est, _ = self.factory.next()
            else:
                conv["c"], body, est, _ = self.factory.next_turn(conv["c"])
                text = []
            self.in_flight += 1
            if self.in_flight > self.max_in_flight:
                self.max_in_flight = self.in_flight
            try:
                rec = await stream_request(self.session, self.url, body, level_idx=idx, level=level, t0=self.t0,
                                           timeout=self.req_timeout, est_prompt_tokens=est, text_out=text)
            finally:
                self.in_flight -= 1
            if conv is not None:
                c = conv["c"]
                rec.turn = c.turn
                if rec.ok:
                    c.reply("".join(text or []), rec.prompt_tokens if rec.tokens_source == "server_usage" else None,
                            rec.output_tokens, est)
                elif not rec.rejected:  # a refused turn is sent again, its conversation kept
                    conv["c"] = None
            recs.append(rec)
            self.emit_record(rec)
            if rec.rejected:
                resend[id(rec)] = (body, est)
                if quota is not None and rec.t_start + self.t0 >= win["w0"]:
                    state.issued -= 1  # a refusal is not one of the level's measured requests
                return rec
            state.done += 1
            if not settled.is_set() and state.done >= settle_n:
                settle(time.monotonic())
            if rec.t_start + self.t0 >= win["w0"]:
                state.last_measured_end = max(state.last_measured_end or 0.0, rec.t_end + self.t0)
                if not rec.rejected:  # a refusal is the server's admission control, not a latency
                    measured.append(rec)
                if decide and quota and state.reason is None and level_decided(measured, spec.slo, quota) is not None:
                    state.reason = "decided"
                    stop.set()
            if not rec.ok:  # a failure (never a rejection: those are the server's admission control)
                admitted = [r for r in recs if not r.rejected]
                n_fail = sum(1 for r in admitted if not r.ok)
                if len(admitted) >= spec.min_requests_for_abort and n_fail / len(admitted) > spec.max_failure_rate:
                    if state.reason not in ("aborted",):
                        state.reason = "failure_rate"
                    stop.set()
            return rec

        resend: dict[int, tuple] = {}  # id(record) of a refusal → (body, est) to send again

        async def rejected_wait(rec: RequestRecord) -> tuple | None:
            """A refused user waits (Retry-After, else the spec's retry wait; the level's end
            wakes it) and gets the request to send again; None when the level stopped."""
            wait = rec.retry_after if rec.retry_after is not None else spec.retry_wait_s
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except (asyncio.TimeoutError, TimeoutError):
                pass
            return resend.pop(id(rec), None)

        tasks: set[asyncio.Task] = set()
        sched: list[list] = []  # a rate level's arrivals: [scheduled, sent or None, waited at the cap]
        if spec.mode == "concurrency":
            async def slot() -> None:
                again = None
                while may_issue():
                    rec = await one(again=again)
                    again = None
                    if rec.rejected:
                        again = await rejected_wait(rec)
                    elif not rec.ok:
                        await asyncio.sleep(FAIL_BACKOFF_S)

            async def user(u: int) -> None:
                """A multi-turn user: conversations one after another, thinking between turns."""
                conv: dict = {"c": None}
                think = spec.multi_turn.think_s if spec.multi_turn is not None else 0.0
                rng = random.Random(f"think:{spec.seed}:{idx}:{u}")
                again = None
                while may_issue():
                    rec = await one(conv, again)
                    again = None
                    if rec.rejected:
                        again = await rejected_wait(rec)
                    elif not rec.ok:
                        await asyncio.sleep(FAIL_BACKOFF_S)
                    elif think > 0 and conv["c"] is not None and not conv["c"].done:
                        try:  # thinking holds no request; the level's end wakes it
                            await asyncio.wait_for(stop.wait(), rng.expovariate(1.0 / think))
                        except (asyncio.TimeoutError, TimeoutError):
                            pass

            for u in range(int(level)):
                tasks.add(asyncio.create_task(user(u) if spec.multi_turn is not None else slot()))
        else:
            sem = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None

            async def capped(entry: list) -> None:
                """Send one arrival; ``entry`` = [scheduled, sent, waited at the cap] (session s)."""
                if sem is None:
                    entry[1] = self.rel(time.monotonic())
                    resend.pop(id(await one()), None)  # a refused arrival is not sent again
                else:
                    entry[2] = sem.locked()  # the cap is full: this arrival waits for a slot
                    async with sem:
                        if not stop.is_set():
                            entry[1] = self.rel(time.monotonic())
                            resend.pop(id(await one()), None)

            async def arrivals() -> None:
                start = time.monotonic()
                for at in spec.arrivals(level, spec.seed, idx):
                    nxt = start + at
                    delay = nxt - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if not may_issue():
                        return
                    entry = [self.rel(nxt), None, False]
                    sched.append(entry)
                    t = asyncio.create_task(capped(entry))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)

            arr_task = asyncio.create_task(arrivals())

        # wait for the end of the level: time, count, failures, abort or the total cap; while
        # a level settles, its window (and so its end) is not known yet — if its users have
        # not all finished a request within step_seconds, the warm-up ends as configured
        while True:
            if not settled.is_set():
                end_at = min(t_level + spec.warmup_seconds + step, cap)
            else:
                end_at = min(win["deadline"], cap)
            waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(self.abort.wait())]
            if not settled.is_set():
                waiters.append(asyncio.create_task(settled.wait()))
            try:
                done, _ = await asyncio.wait(
                    waiters, timeout=max(0.0, end_at - time.monotonic()) if end_at < math.inf else None,
                    return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            if stop.is_set() or self.abort.is_set():
                break
            if not settled.is_set():  # timed out settling: the configured warm-up stands
                settle(t_level + spec.warmup_seconds)
                if time.monotonic() >= min(win["deadline"], cap):
                    break
                continue
            if not done or time.monotonic() >= min(win["deadline"], cap):
                break
        deadline, w0 = win["deadline"], win["w0"]
        t_stop = time.monotonic()
        if self.abort.is_set():
            state.reason = "aborted"
        elif state.reason is None:
            state.reason = "total_cap" if cap <= deadline and t_stop >= cap else "duration"
        stop.set()
        if "first" in scrapes and not scrapes["first"].done() and win["w0"] > time.monotonic():
            scrapes.pop("first").cancel()  # stopped before its window began: no window to read
        if state.reason not in ("count", "decided", "aborted") and "first" in scrapes:
            scrapes["last"] = asyncio.create_task(self._scrape())
        if spec.mode == "rate":
            arr_task.cancel()
            await asyncio.gather(arr_task, return_exceptions=True)

        # drain the in-flight requests (cancel them when aborting or failing)
        pending = set(tasks)
        if state.reason in ("aborted", "failure_rate", "total_cap"):
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        elif pending:
            ab = asyncio.create_task(self.abort.wait())
            remaining = {t for t in pending if not t.done()}
            while remaining and not self.abort.is_set():
                done, _ = await asyncio.wait(remaining | {ab}, timeout=spec.request_timeout + 5,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                remaining = {t for t in remaining if not t.done()}
            ab.cancel()
            if self.abort.is_set():
                state.reason = "aborted"
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        t_end = time.monotonic()
        if state.reason == "aborted":
            for t in scrapes.values():
                t.cancel()
            scrapes.clear()
        elif state.reason in ("count", "decided") and "first" in scrapes:
            scrapes["last"] = asyncio.create_task(self._scrape())

        reason = state.reason
        assert reason is not None  # set when the level stopped sending (above)
        w0, w1 = level_window(reason, w0, deadline, t_stop, state.last_measured_end)
        st = compute_step_stats(recs, idx=idx, level=level, mode=spec.mode, t_start=self.rel(t_level),
                                t_end=self.rel(t_end), window_start=self.rel(w0), window_end=self.rel(w1),
                                slo=spec.slo, max_in_flight=self.max_in_flight, stop_reason=reason,
                                arrivals=[tuple(e) for e in sched] if spec.mode == "rate" else None,
                                send_end=self.rel(t_stop))
        if "last" in scrapes:
            await self._server_stats(st, scrapes.get("first"), scrapes["last"], recs, reset)
        else:
            for t in scrapes.values():
                t.cancel()
        return st
