"""Step statistics per ramp level, and knee detection.

Definitions (as ``vllm bench serve``, vllm/benchmarks/serve.py, where it has them):

- Steady-state window ``[window_start, window_end]``: from the end of the level's
  warm-up to the moment it stopped sending (duration-limited level) or to the end of
  its last measured request (count-limited level). ``window_s`` is its length.
- Measured requests: those *sent* inside the window. Latency figures use the measured
  requests that succeeded: TTFT (first output chunk − send; requests without output
  are left out, TTFT undefined), TPOT = (e2e − TTFT) / (output tokens − 1) over
  requests with ≥ 2 output tokens, ITL = every gap between consecutive output chunks
  (per chunk), e2e. Percentiles are ``numpy.percentile`` (linear), as vllm bench.
- Throughput counts what arrives inside the window, whoever sent it: output tokens/s =
  output chunks arriving in the window, each weighted by its request's output tokens ÷
  output chunks, ÷ ``window_s``; total tokens/s adds the prompt tokens of requests
  sent in the window; requests/s = successful requests ending in the window ÷
  ``window_s``; goodput = those that also met every SLO bound ÷ ``window_s``.
- Failure rate = failed ÷ the measured requests the server admitted; failures are counted
  by status. A request the server refused with HTTP 503 (vLLM's admission control,
  ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``: app.engine.admission) is not a
  failure: ``rejected`` counts them and the rejection rate = rejected ÷ measured requests
  (the attempts), bounded by the SLO's ``rejection_rate``.
- Open loop (a request-rate level, issue 20): ``offered_rps`` = the level's rate;
  ``achieved_rps`` = measured requests ÷ the time the window spent sending (to the level's
  end of sending: a count-limited level's window goes on while it drains); ``rps`` is the
  completed rate. ``n_scheduled``: arrivals the seeded draw placed in that time;
  ``n_delayed``: of those, the ones that found the ``max_concurrency`` cap full and
  waited; ``n_held``: the ones still waiting when the level stopped sending (never sent).
  A level is *short* (``rate_short``) when it achieved less than
  :data:`app.loadgen.arrivals.SHORT_FRACTION` of the offered rate: ``server`` when the
  cap delayed or held requests (the server did not finish them as fast as they came) or,
  the rate achieved, when fewer completed in the window than were sent by more than 5 %
  and what filling the pipeline explains (the achieved rate × the mean e2e of the first
  quarter of its requests, less the warm-up and any drain inside the window),
  ``client`` when the load generator sent fewer than were drawn with the cap idle (it
  sent late), ``draw`` when it sent what the seeded draw gave and the draw itself came
  out low (too short a window for the rate: not a shortfall of either side).
- Reasoning (issue 38 item 2): TTFA (time to first answer token: the first output chunk
  that is not ``delta.reasoning``, app.loadgen.records) p50/p99 over the successful
  requests that had an answer — equal to TTFT for a model that does not reason — and the
  mean reasoning tokens per successful request.
- Per-turn TTFT (multi-turn ramps, ``RampSpec.multi_turn``): the measured successful
  requests grouped by their conversation turn (``RequestRecord.turn``), each turn's
  count and TTFT p50/p99 (:class:`TurnStats`, the level's ``turns``).
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
from pydantic import BaseModel

from app.loadgen.arrivals import SHORT_FRACTION
from app.loadgen.records import RequestRecord
from app.loadgen.server_stats import ServerStats
from app.loadgen.spec import SLO
from app.metrics import is_partial


class TurnStats(BaseModel):
    """TTFT of one conversation turn at a level (multi-turn ramps): ``turn`` (1 = a
    conversation's first request), ``n`` measured successful requests of that turn with
    a TTFT, ``ttft_p50``/``ttft_p99`` (s, numpy linear percentiles)."""

    turn: int
    n: int
    ttft_p50: Optional[float] = None
    ttft_p99: Optional[float] = None


def turn_stats(ok: Sequence[RequestRecord]) -> list[TurnStats]:
    """Per-turn TTFT of successful requests (those with ``turn`` ≥ 1), in turn order; []
    when none is a conversation's turn."""
    by: dict[int, list[float]] = {}
    for r in ok:
        if r.turn and r.ttft is not None:
            by.setdefault(r.turn, []).append(r.ttft)
    out = []
    for t in sorted(by):
        a = np.asarray(by[t], dtype=np.float64)
        out.append(TurnStats(turn=t, n=int(a.size), ttft_p50=_pct(a, 50), ttft_p99=_pct(a, 99)))
    return out


def turns_text(turns: Sequence[Any], max_turns: int = 8) -> str:
    """One line of a level's per-turn TTFT (``StepStats.turns``, TurnStats or their
    dicts): ``turn 1 66/80 ms (n 11) · turn 2 …`` (p50/p99, ms); the first
    ``max_turns`` turns, then how many more. "" when there are none."""
    def get(t: Any, k: str) -> Any:
        return t.get(k) if isinstance(t, dict) else getattr(t, k)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.0f}"

    parts = [f"turn {get(t, 'turn')} {ms(get(t, 'ttft_p50'))}/{ms(get(t, 'ttft_p99'))} ms (n {get(t, 'n')})"
             for t in list(turns)[:max_turns]]
    if len(turns) > max_turns:
        parts.append(f"+{len(turns) - max_turns} more turns")
    return " · ".join(parts)


class StepStats(BaseModel):
    """Statistics of one level. Times in s (session clock), rates per s, tokens.
    ``stop_reason``: ``duration``, ``count``, ``decided`` (a search level stopped once its
    verdict was decided: app.loadgen.capacity.level_decided), ``failure_rate``, or one of
    :data:`app.metrics.PARTIAL_STOPS` (:attr:`partial`)."""

    idx: int
    level: float
    mode: str = "concurrency"
    t_start: float
    t_end: float
    window_start: float
    window_end: float
    window_s: float
    stop_reason: str = "duration"
    n_measured: int = 0
    n_ok: int = 0
    max_in_flight: int = 0
    output_tps: float = 0.0
    total_tps: float = 0.0
    rps: float = 0.0
    goodput_rps: float = 0.0
    ttft_p50: Optional[float] = None
    ttft_p90: Optional[float] = None
    ttft_p99: Optional[float] = None
    ttft_max: Optional[float] = None
    ttft_mean: Optional[float] = None
    #: time to first answer token (after the reasoning), s; ``reasoning_tokens_mean`` tokens per request
    ttfa_p50: Optional[float] = None
    ttfa_p99: Optional[float] = None
    reasoning_tokens_mean: Optional[float] = None
    tpot_p50: Optional[float] = None
    tpot_p99: Optional[float] = None
    tpot_mean: Optional[float] = None
    itl_p50: Optional[float] = None
    itl_p99: Optional[float] = None
    itl_mean: Optional[float] = None
    e2e_p50: Optional[float] = None
    e2e_p99: Optional[float] = None
    e2e_mean: Optional[float] = None
    failures: dict[str, int] = {}
    failure_rate: float = 0.0
    #: measured requests the server refused with HTTP 503 (admission control), not in ``failures``
    rejected: int = 0
    #: rejected ÷ measured requests (the attempts), a fraction
    rejection_rate: float = 0.0
    slo_broken: list[str] = []
    steady: bool = True
    repeat: int = 0  # a capacity search's repeat that probed this level
    #: the server's own figures over the window from its /metrics (app.loadgen.server_stats);
    #: None when it has none (not vLLM) or the level was aborted
    server: Optional[ServerStats] = None
    #: why ``server`` is None when /metrics was asked for and did not answer (e.g. "GET /metrics: HTTP 404")
    server_problem: Optional[str] = None
    # open loop (mode "rate"; None / 0 for a closed-loop level): see the module's definitions
    offered_rps: Optional[float] = None
    achieved_rps: Optional[float] = None
    n_scheduled: Optional[int] = None
    n_delayed: int = 0
    n_held: int = 0
    rate_short: Optional[str] = None  # "server", "client" or "draw"

    @property
    def rate_note(self) -> str | None:
        """Why a rate level fell short of its offered rate, in words (None when it did not):
        e.g. ``achieved 3.1 of 4 req/s offered: the server did not keep up (the
        max_concurrency cap delayed 40 requests, held back 12)``."""
        return rate_note(self)
    #: multi-turn ramps: TTFT per conversation turn (:func:`turn_stats`); [] otherwise
    turns: list[TurnStats] = []

    @property
    def slo_met(self) -> bool:
        return not self.slo_broken

    @property
    def partial(self) -> bool:
        """The level was cut short (:func:`is_partial`)."""
        return is_partial(self)

    @property
    def unsteady_reason(self) -> str | None:
        """Why this level's figures are a start-up transient, not a steady state (None
        when they are not): its measuring window was shorter than its median request, so
        the window saw mostly the prefills of requests sent together and few of their
        tokens (e.g. 5 tok/s where a 15 s step measures 138). The knee ignores such levels."""
        if self.steady:
            return None
        return (f"level {self.level:g}: the {self.window_s:.3g} s window is shorter than its median request "
                f"(e2e p50 {self.e2e_p50:.3g} s) — a start-up transient, not a steady state; use a step of at "
                f"least {3 * (self.e2e_p50 or 0):.3g} s or a warm-up of {self.e2e_p50:.3g} s")


def rate_note(st: Any) -> str | None:
    """:attr:`StepStats.rate_note` of a StepStats or its stored dict."""
    get: Callable[[str], Any] = (lambda k: st.get(k)) if isinstance(st, dict) else (lambda k: getattr(st, k, None))
    why = get("rate_short")
    if not why or get("offered_rps") is None or get("achieved_rps") is None:
        return None
    head = f"achieved {get('achieved_rps'):.3g} of {get('offered_rps'):.3g} req/s offered"
    if why == "server":
        if get("n_delayed") or get("n_held"):
            return (f"{head}: the server did not keep up — the max_concurrency cap was full (delayed "
                    f"{get('n_delayed') or 0} requests, held back {get('n_held') or 0})")
        if get("achieved_rps") >= SHORT_FRACTION * get("offered_rps"):
            return (f"sent {get('achieved_rps'):.3g} req/s as offered ({get('offered_rps'):.3g}) but completed "
                    f"{get('rps') or 0:.3g}: the server did not keep up (requests queued)")
        return f"{head}: the server did not keep up — completed {get('rps') or 0:.3g} req/s"
    if why == "client":
        return (f"{head}: the load generator did not keep up — it sent {get('n_measured')} of the "
                f"{get('n_scheduled')} requests drawn (its CPU is busy; fewer rates or a second client)")
    return (f"{head}: the seeded draw gave {get('n_scheduled')} arrivals in the window (not a shortfall of the client "
            f"or the server: a longer step evens it out)")


def open_loop_figures(records: Sequence[RequestRecord], level: float, w0: float, w1: float, send_end: float | None,
                      arrivals: Sequence[tuple[float, float | None, bool]], rps: float,
                      warmup_s: float) -> dict[str, Any]:
    """The open-loop fields of a rate level (the module's definitions): ``arrivals``
    are ``(scheduled, sent or None, waited at the cap)`` per arrival, session-clock s;
    ``send_end`` when the level stopped sending (None: ``w1``)."""
    s1 = min(w1, send_end) if send_end is not None else w1
    span = max(s1 - w0, 1e-3)
    sent = sum(1 for r in records if w0 <= r.t_start <= s1)
    inside = [a for a in arrivals if w0 <= a[0] <= s1]
    n_sched = len(inside)
    delayed = sum(1 for a in inside if a[2])
    held = sum(1 for a in inside if a[1] is None)
    achieved = sent / span
    short = None
    if achieved < SHORT_FRACTION * level:
        if delayed or held:
            short = "server"
        elif sent < SHORT_FRACTION * n_sched:
            short = "client"
        else:
            short = "draw"
    else:
        # completions short of the sends beyond the pipeline's filling: a level without a
        # warm-up as long as its requests completes nothing in its first e2e seconds. The
        # e2e of the first quarter of its requests (by send time) is the fill's length — a
        # server that falls behind queues the later ones longer and longer
        ok = sorted((r for r in records if r.ok and r.e2e is not None and w0 <= r.t_start <= s1),
                    key=lambda r: r.t_start)
        if ok:
            early = ok[:max(1, len(ok) // 4)]
            e2e_early = sum(r.e2e or 0.0 for r in early) / len(early)  # each has one (filtered above)
            # in requests: a window that goes on past the sending (a count-limited level's
            # drain) sees those sent last complete too
            fill = achieved * max(0.0, e2e_early - warmup_s - (w1 - s1))
            if rps * max(w1 - w0, 1e-3) < SHORT_FRACTION * sent - fill:
                short = "server"
    return {"offered_rps": level, "achieved_rps": achieved, "n_scheduled": n_sched, "n_delayed": delayed,
            "n_held": held, "rate_short": short}


def _pct(a: np.ndarray, q: float) -> Optional[float]:
    return float(np.percentile(a, q)) if a.size else None


def _mean(a: np.ndarray) -> Optional[float]:
    return float(a.mean()) if a.size else None


def meets_slo(r: RequestRecord, slo: SLO) -> bool:
    """Whether one successful request is within every bound of ``slo``."""
    if not r.ok:
        return False
    if slo.ttft_p99 is not None and (r.ttft is None or r.ttft > slo.ttft_p99):
        return False
    if slo.tpot_p99 is not None:
        tp = r.tpot
        if tp is not None and tp > slo.tpot_p99:
            return False
    if slo.e2e_p99 is not None and (r.e2e is None or r.e2e > slo.e2e_p99):
        return False
    if slo.ttfa_p99 is not None and (r.ttfa is None or r.ttfa > slo.ttfa_p99):
        return False
    return True


def compute_step_stats(records: Sequence[RequestRecord], *, idx: int, level: float, mode: str,
                       t_start: float, t_end: float, window_start: float, window_end: float,
                       slo: SLO | None = None, max_in_flight: int = 0,
                       stop_reason: str = "duration",
                       arrivals: Sequence[tuple[float, float | None, bool]] | None = None,
                       send_end: float | None = None) -> StepStats:
    """StepStats of one level from its records (all of the level's, warm-up included).

    Times are session-clock seconds. A window shorter than 1 ms is widened to 1 ms
    (a degenerate level must not divide by zero). A rate level (``mode`` ``rate``) also
    gets its open-loop figures (:func:`open_loop_figures`) from ``arrivals`` (each
    ``(scheduled, sent or None, waited at the max_concurrency cap)``; None: every
    measured request was scheduled when sent, none waited) and ``send_end`` (when it
    stopped sending; None: the window's end).
    """
    slo = slo or SLO()
    w0, w1 = window_start, window_end
    ws = max(w1 - w0, 1e-3)
    measured = [r for r in records if w0 <= r.t_start <= w1]
    ok = [r for r in measured if r.ok]
    failures: dict[str, int] = {}
    rejected = 0
    for r in measured:
        if r.rejected:
            rejected += 1
        elif not r.ok:
            failures[r.status] = failures.get(r.status, 0) + 1
    admitted = len(measured) - rejected

    ttft = np.array([r.ttft for r in ok if r.ttft is not None], dtype=np.float64)
    ttfa = np.array([r.ttfa for r in ok if r.ttfa is not None], dtype=np.float64)
    tpot = np.array([t for t in (r.tpot for r in ok) if t is not None], dtype=np.float64)
    e2e = np.array([r.e2e for r in ok if r.e2e is not None], dtype=np.float64)
    itls = [r.itl for r in ok if r.chunk_offsets.size > 1]
    itl = np.concatenate(itls) if itls else np.zeros(0)

    out_tokens = 0.0
    for r in records:
        n = r.chunk_offsets.size
        if not n:
            continue
        arr = r.t_start + r.chunk_offsets.astype(np.float64)
        inside = int(np.count_nonzero((arr >= w0) & (arr <= w1)))
        if inside:
            out_tokens += inside * (r.output_tokens / n if r.output_tokens else 1.0)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in measured)
    ended_ok = [r for r in records if r.ok and w0 <= r.t_end <= w1]

    st = StepStats(
        idx=idx, level=level, mode=mode, t_start=t_start, t_end=t_end, window_start=w0, window_end=w1,
        window_s=ws, stop_reason=stop_reason, n_measured=len(measured), n_ok=len(ok),
        max_in_flight=max_in_flight, output_tps=out_tokens / ws, total_tps=(out_tokens + prompt_tokens) / ws,
        rps=len(ended_ok) / ws, goodput_rps=sum(1 for r in ended_ok if meets_slo(r, slo)) / ws,
        ttft_p50=_pct(ttft, 50), ttft_p90=_pct(ttft, 90), ttft_p99=_pct(ttft, 99),
        ttft_max=float(ttft.max()) if ttft.size else None, ttft_mean=_mean(ttft),
        ttfa_p50=_pct(ttfa, 50), ttfa_p99=_pct(ttfa, 99),
        reasoning_tokens_mean=float(np.mean([r.reasoning_tokens for r in ok])) if ok else None,
        tpot_p50=_pct(tpot, 50), tpot_p99=_pct(tpot, 99), tpot_mean=_mean(tpot),
        itl_p50=_pct(itl, 50), itl_p99=_pct(itl, 99), itl_mean=_mean(itl),
        e2e_p50=_pct(e2e, 50), e2e_p99=_pct(e2e, 99), e2e_mean=_mean(e2e),
        failures=failures, failure_rate=(admitted - len(ok)) / admitted if admitted else 0.0,
        rejected=rejected, rejection_rate=rejected / len(measured) if measured else 0.0,
        turns=turn_stats(ok),
    )
    if mode == "rate":
        sends = arrivals if arrivals is not None else [(r.t_start, r.t_start, False) for r in records]
        for k, v in open_loop_figures(records, level, w0, w1, send_end, sends, st.rps, w0 - t_start).items():
            setattr(st, k, v)
    st.slo_broken = slo_breaches(st, slo)
    # a window shorter than the median request measures how the level started, not how it runs
    st.steady = not (st.e2e_p50 is not None and st.e2e_p50 > ws)
    return st


def level_window(reason: str, warmup_end: float, deadline: float, t_stop: float,
                 last_measured_end: float | None) -> tuple[float, float]:
    """The steady-state window ``(window_start, window_end)`` of a level (the module's
    definition): from the end of its warm-up to the end of its last measured request
    when it stopped at its request count (``reason`` ``count``, or ``decided``: a search
    level whose verdict was decided early), to ``min(t_stop,
    deadline)`` when its time ran out (``duration``), else (aborted, failures, cap) to
    ``t_stop``. The load generator and the planner's prediction both cut levels by it."""
    if reason in ("count", "decided") and last_measured_end:
        w1 = last_measured_end
    else:
        w1 = min(t_stop, deadline) if reason == "duration" else t_stop
    return min(warmup_end, w1), w1


def _breach(name: str, val: float, bound: float) -> str:
    return f"{name} {val:.3g} s > {bound:g} s"


_BREACH = re.compile(r"^(\w+) (\S+) s > (\S+) s$")


def slo_breaches(st: StepStats, slo: SLO) -> list[str]:
    """Human-readable list of the SLO bounds a level broke, e.g. ``["ttft_p99 0.81 s > 0.5 s",
    "failure_rate 12.0% > 5.0%"]``."""
    out = []
    for name in ("ttft_p99", "tpot_p99", "e2e_p99", "ttfa_p99"):
        bound = getattr(slo, name)
        val = getattr(st, name)
        if bound is not None and val is not None and val > bound:
            out.append(_breach(name, val, bound))
    bound = slo.failure_bound
    if bound is not None and st.n_measured and st.failure_rate > bound:
        out.append(f"failure_rate {st.failure_rate:.1%} > {bound:.1%}")
    if slo.rejection_rate is not None and st.n_measured and st.rejection_rate > slo.rejection_rate:
        out.append(f"rejection_rate {st.rejection_rate:.1%} > {slo.rejection_rate:.1%}")
    return out


def slo_stop_reason(st: StepStats) -> str:
    """The ramp's stop reason when level ``st`` broke its SLO, in ``st``'s seconds."""
    return f"SLO broken at level {st.level:g}: {'; '.join(st.slo_broken)}"


def rig_stop_reason(status: str, reason: str, rig_steps: Sequence[StepStats]) -> str:
    """A ramp's stop reason in rig seconds: the load generator wrote an SLO stop in wall
    seconds (against the SLO ÷ k); rebuilt from the last level's rig-time stats
    (:func:`to_rig_time`). Other reasons are returned unchanged."""
    if status == "slo_broken" and rig_steps and rig_steps[-1].slo_broken:
        return slo_stop_reason(rig_steps[-1])
    return reason


class Knee(BaseModel):
    """The knee of a ramp: the last level before throughput stops paying for latency.

    ``level``: the knee level; ``next_level``: the level after it. Evidence: both
    levels' output tokens/s and TTFT p99 (s), the throughput growth per doubling of the
    level (fraction) and the TTFT p99 ratio.
    """

    level: float
    next_level: float
    output_tps: float
    next_output_tps: float
    ttft_p99: float
    next_ttft_p99: float
    gain_per_doubling: float
    ttft_ratio: float

    def describe(self) -> str:
        return (f"knee at {self.level:g}: {self.level:g} → {self.next_level:g} gains "
                f"{self.gain_per_doubling * 100:.0f}% throughput per doubling "
                f"({self.output_tps:.0f} → {self.next_output_tps:.0f} tok/s) while TTFT p99 grows "
                f"{self.ttft_ratio:.1f}× ({self.ttft_p99 * 1e3:.0f} → {self.next_ttft_p99 * 1e3:.0f} ms)")


def find_knee(steps: Iterable[StepStats], gain: float = 0.15, ttft_ratio: float = 1.5) -> Knee | None:
    """First level L (in increasing order) such that going to the next level L' grows
    output throughput by less than ``gain`` per doubling — (tps'/tps)^(1/log2(L'/L)) − 1
    — while TTFT p99 grows by at least ``ttft_ratio``×, and no later level grows
    throughput from L by ``gain`` per doubling or more (a knee is where throughput stops
    growing for good, not a dip that the next levels climb out of). None when no level
    qualifies.

    Rule from issue #3 (default 15 %/doubling, 1.5×); levels without successful
    requests, and levels that measured a start-up transient (``steady`` False, see
    :attr:`StepStats.unsteady_reason`), are skipped.
    """
    s = sorted((x for x in steps if x.n_ok and x.output_tps > 0 and x.ttft_p99 and x.steady), key=lambda x: x.level)

    def growth(a: StepStats, b: StepStats) -> float:
        return (b.output_tps / a.output_tps) ** (1.0 / math.log2(b.level / a.level)) - 1.0

    for i, (a, b) in enumerate(zip(s, s[1:])):
        ta, tb = a.ttft_p99, b.ttft_p99
        if b.level <= a.level or not ta or not tb:  # (every level kept has a TTFT p99)
            continue
        g = growth(a, b)
        r = tb / ta
        later_growth = any(growth(a, c) >= gain for c in s[i + 2:] if c.level > a.level)
        if g < gain and r >= ttft_ratio and not later_growth:
            return Knee(level=a.level, next_level=b.level, output_tps=a.output_tps, next_output_tps=b.output_tps,
                        ttft_p99=ta, next_ttft_p99=tb, gain_per_doubling=g, ttft_ratio=r)
    return None


#: StepStats fields in seconds (× k for rig time) and per second (÷ k)
_TIME_FIELDS = ("t_start", "t_end", "window_start", "window_end", "window_s", "ttft_p50", "ttft_p90", "ttft_p99",
                "ttft_max", "ttft_mean", "ttfa_p50", "ttfa_p99", "tpot_p50", "tpot_p99", "tpot_mean", "itl_p50", "itl_p99", "itl_mean",
                "e2e_p50", "e2e_p99", "e2e_mean")
_RATE_FIELDS = ("output_tps", "total_tps", "rps", "goodput_rps")
#: open-loop rate fields (None for a closed-loop level): per second, ÷ k in rig time
_OPEN_RATE_FIELDS = ("offered_rps", "achieved_rps")


#: a level whose failure rate reaches this does not count as a peak (a fraction)
PEAK_MAX_FAILURE_RATE = 0.5


def peak_level(steps: Sequence[Any]) -> Any | None:
    """The one definition of a run's *peak*: the level with the highest output tokens/s
    among those that met the SLO (no breach) and failed fewer than
    :data:`PEAK_MAX_FAILURE_RATE` of their requests; when no level qualifies, the highest
    of all. ``steps``: StepStats, or mappings with ``output_tps``, ``failure_rate`` and
    ``slo_broken`` (a list of breaches) or ``slo_met`` (bool). None for no level."""
    def get(x: Any, k: str, d: Any = None) -> Any:
        return x.get(k, d) if isinstance(x, dict) else getattr(x, k, d)

    def met(x: Any) -> bool:
        sm = get(x, "slo_met")
        if sm is not None:
            return bool(sm)
        return not get(x, "slo_broken")

    steps = list(steps)
    ok = [x for x in steps if met(x) and (get(x, "failure_rate") or 0.0) < PEAK_MAX_FAILURE_RATE] or steps
    return max(ok, key=lambda x: get(x, "output_tps") or 0.0, default=None)


def to_rig_time(st: StepStats, k: float) -> StepStats:
    """A level's stats in rig seconds for a sim running ``k``× faster than the wall clock
    (times × k, rates ÷ k; docs/design.md, "Sim time"); ``k == 1`` returns ``st`` unchanged."""
    if k == 1.0:
        return st
    upd: dict[str, Any] = {f: getattr(st, f) * k for f in _TIME_FIELDS if getattr(st, f) is not None}
    upd.update({f: getattr(st, f) / k for f in _RATE_FIELDS})
    if st.server is not None:  # its figures are the server's own (rig) seconds; only the scrape instants are wall
        upd["server"] = st.server.model_copy(update={"scrape_start": st.server.scrape_start * k,
                                                     "scrape_end": st.server.scrape_end * k})
    if st.turns:
        upd["turns"] = [t.model_copy(update={f: getattr(t, f) * k for f in ("ttft_p50", "ttft_p99")
                                              if getattr(t, f) is not None}) for t in st.turns]
    if st.mode == "rate":  # the level is a request rate: per wall second → per rig second
        upd["level"] = st.level / k
        upd.update({f: getattr(st, f) / k for f in _OPEN_RATE_FIELDS if getattr(st, f) is not None})
    if st.slo_broken:  # "ttft_p99 0.757 s > 0.5 s" (wall) → "ttft_p99 3.03 s > 2 s" (rig)
        msgs = []
        for m in st.slo_broken:
            g = _BREACH.match(m)
            msgs.append(_breach(g[1], float(g[2]) * k, float(g[3]) * k) if g else m)
        upd["slo_broken"] = msgs
    return st.model_copy(update=upd)


def records_to_rig(records: Sequence[RequestRecord], k: float) -> list[RequestRecord]:
    """Requests timed on the wall clock → rig seconds for a sim ``k``× faster (send time,
    TTFT, e2e and chunk offsets × k; a rate level ÷ k is not needed: records keep the
    level they were sent at only as a label). ``k == 1`` returns them as a list."""
    if k == 1.0:
        return list(records)
    out = []
    for r in records:
        out.append(RequestRecord(
            level_idx=r.level_idx, level=r.level, t_start=r.t_start * k,
            ttft=None if r.ttft is None else r.ttft * k, e2e=None if r.e2e is None else r.e2e * k,
            prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, tokens_source=r.tokens_source,
            status=r.status, error=r.error, chunk_offsets=(r.chunk_offsets * k).astype(np.float32), turn=r.turn,
            retry_after=r.retry_after, ttfa=None if r.ttfa is None else r.ttfa * k,
            reasoning_tokens=r.reasoning_tokens))
    return out


def knee_to_rig(knee: Knee | None, k: float) -> Knee | None:
    """A knee found on wall-clock stats → rig time (throughputs ÷ k, TTFT × k; the
    growth figures are ratios and stay). ``None`` or ``k == 1`` is returned unchanged."""
    if knee is None or k == 1.0:
        return knee
    return knee.model_copy(update={"output_tps": knee.output_tps / k, "next_output_tps": knee.next_output_tps / k,
                                   "ttft_p99": knee.ttft_p99 * k, "next_ttft_p99": knee.next_ttft_p99 * k})
