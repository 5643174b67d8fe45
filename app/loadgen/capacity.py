"""Capacity search: the largest concurrency (or request rate) that meets the SLO.

The search probes upward from ``start`` by doubling until a level breaks the SLO (or
``max_level`` is reached), downward by halving when ``start`` itself breaks, then
bisects between the last level that met the SLO (``lo``) and the first that broke it
(``hi``) until ``hi − lo ≤ max(min_step, resolution × lo)`` — by default within 10 %
or one user. Each probed level is judged on its own measured requests; a level ends
once it has sent ``RampSpec.requests_per_level`` measured requests (the floor, default
100: a p99 from fewer is marked as such) or after ``step_seconds`` (the cap).

The capacity's interval is the search's bracket (:func:`bracket`, issue 37 item 3): it
never extends past a level the same search measured as broken, nor below one it measured
as met. For one search (one repeat): ``users_low`` = the capacity C, the largest level
measured met below the lowest level measured broken B; ``users_high`` = B — the SLO's
crossing lies in [C, B] (:func:`crossing_users` interpolates it there), and a search run
again may meet B by chance but measured nothing between C and B. Without a broken level
(``max_level`` met) the interval is [C, C]; with no level met, [0, B]. The bootstrap
(:func:`met_probability`) says per level how sure its verdict is; it never moves the
interval past a measurement (it used to: "19 (19–23)" with 20 measured broken, "26
(26–36)" with 27 broken, and a tune's "27 (27–27)" where a second search met 28 — the
bracket gives 19–20, 26–27 and 27–28). When the outcomes are not monotone (a level met
above B: noise, or a fixed ramp), C stays the conservative answer and no interval can
hold every measurement; the broken rule wins. With repeats, the search runs again from
``start`` each time; the capacity is the mean of the repeats' and its interval spans
their brackets.

The same next-level rule serves GuideLLM-style open-loop searches (``mode: rate``,
levels in requests/s). Units: users (requests in flight) or requests/s, seconds.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np
from pydantic import BaseModel

from app.loadgen.records import RequestRecord
from app.loadgen.spec import SLO, CapacitySearch
from app.loadgen.stats import StepStats, slo_breaches

#: a p99 judged on fewer requests than this is marked as such (100 samples put one
#: request above the 99th percentile)
P99_MIN_REQUESTS = 100

#: a search level's time cap when none is given (rig s): the floor of
#: :data:`P99_MIN_REQUESTS` requests ends it first unless the level is very slow
SEARCH_STEP_CAP_S = 600.0

#: bootstrap resamples per level (:func:`met_probability`: how sure a level's verdict is)
BOOTSTRAP_RESAMPLES = 400


def _snap(x: float, mode: str) -> float:
    """A level as the ramp runs it: whole users in concurrency mode, 3 significant
    digits of req/s in rate mode."""
    if mode == "concurrency":
        return float(max(1, int(x)))
    return float(f"{x:.3g}")


def resolved(search: CapacitySearch, lo: float, hi: float, mode: str = "concurrency") -> bool:
    """Whether the bracket [lo, hi] is as narrow as the search resolves: ``hi − lo ≤
    max(min_step, resolution × lo)``, the resolution rounded up to whole users in
    concurrency mode (levels are whole users: 10 % of 19 users is an interval of 2, so
    19–21 is resolved and a probe at 20 would measure nothing the answer needs)."""
    width = search.resolution * lo
    if mode == "concurrency":
        width = math.ceil(width - 1e-9)
    return hi - lo <= max(search.step(mode), width)


def next_level(search: CapacitySearch, history: Sequence[tuple[float, bool]], mode: str = "concurrency") -> float | None:
    """The next level to probe given ``history`` (``(level, met)`` in the order probed,
    this repeat only), or None when the search is done. Up: × ``search.growth`` (at
    least one step); down: ÷ it; then bisection until :func:`resolved`."""
    if not history:
        return _snap(min(search.start, search.max_level), mode)
    probed = {lv for lv, _ in history}
    broke = [lv for lv, met in history if not met]
    hi = min(broke, default=None)
    lo = max((lv for lv, met in history if met and (hi is None or lv < hi)), default=None)
    floor = _snap(search.step(mode), mode) if mode == "rate" else 1.0
    if hi is None:  # everything probed met the SLO: go up
        top = max(probed)
        if top >= search.max_level:
            return None
        nxt = _snap(min(max(top * search.growth, top + search.step(mode)), search.max_level), mode)
        return nxt if nxt not in probed else None
    if lo is None:  # even the lowest probed level broke it: go down
        if hi <= floor:
            return None
        nxt = _snap(max(floor, min(hi / search.growth, hi - search.step(mode))), mode)
        return nxt if nxt not in probed and nxt < hi else None
    if resolved(search, lo, hi, mode):
        return None
    nxt = _snap((lo + hi) / 2, mode)
    return nxt if lo < nxt < hi and nxt not in probed else None


def levels_left(search: CapacitySearch, history: Sequence[tuple[float, bool]], mode: str = "concurrency",
                depth: int = 12) -> float:
    """The expected number of levels a search still probes after ``history`` (one
    repeat's ``(level, met)``), the level being probed included when ``history`` ends
    before it: each next level met or broken with even odds (the search brackets the
    crossing, so either is as likely), averaged over the outcomes — the progress's
    ETA (levels × a level's duration). Later repeats add their first search's count."""
    nxt = next_level(search, history, mode)
    if nxt is None or depth <= 0:
        return 0.0
    hist = list(history)
    return 1.0 + 0.5 * (levels_left(search, hist + [(nxt, True)], mode, depth - 1)
                        + levels_left(search, hist + [(nxt, False)], mode, depth - 1))


def search_levels(search: CapacitySearch, judged: Iterable[tuple[int, float, bool]], mode: str) -> tuple[int, float] | None:
    """The next ``(repeat, level)`` given every judged level so far as ``(repeat,
    level, met)``, or None when the last repeat is done."""
    hist: dict[int, list[tuple[float, bool]]] = {}
    for rep, lv, met in judged:
        hist.setdefault(rep, []).append((lv, met))
    rep = max(hist, default=0)
    while rep < search.repeat:
        nxt = next_level(search, hist.get(rep, []), mode)
        if nxt is not None:
            return rep, nxt
        rep += 1
    return None


# --------------------------------------------------------------------------- judging
def judged_requests(st: StepStats, records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests level ``st`` is judged on: those of its index sent inside its
    measuring window (app.loadgen.stats: "measured requests")."""
    return [r for r in records if r.level_idx == st.idx and st.window_start <= r.t_start <= st.window_end]


def met_probability(recs: Sequence[RequestRecord], slo: SLO, *, seed: int = 0,
                    resamples: int = BOOTSTRAP_RESAMPLES) -> float | None:
    """The fraction of bootstrap resamples (with replacement, same size) of one level's
    judged requests whose p99s, failure rate (of the admitted) and rejection rate meet
    ``slo`` — how sure the verdict "met" is. None without requests. Percentiles as
    app.loadgen.stats (numpy linear)."""
    n = len(recs)
    if not n:
        return None
    ok = np.array([r.ok for r in recs], dtype=bool)
    rejected = np.array([r.rejected for r in recs], dtype=bool)
    nan = float("nan")
    cols = {"ttft_p99": np.array([r.ttft if r.ok and r.ttft is not None else nan for r in recs]),
            "tpot_p99": np.array([t if r.ok and (t := r.tpot) is not None else nan for r in recs]),
            "e2e_p99": np.array([r.e2e if r.ok and r.e2e is not None else nan for r in recs]),
            "ttfa_p99": np.array([r.ttfa if r.ok and r.ttfa is not None else nan for r in recs])}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    met = np.ones(resamples, dtype=bool)
    for name, col in cols.items():
        bound = getattr(slo, name)
        if bound is None:
            continue
        if not np.isfinite(col).any():
            p = np.full(resamples, nan)
        elif np.isnan(col).any():
            p = np.nanpercentile(col[idx], 99, axis=1)
        else:  # the same figure, vectorised (nanpercentile goes row by row)
            p = np.percentile(col[idx], 99, axis=1)
        met &= ~(p > bound)  # a resample with no value for it does not break it
    if slo.failure_bound is not None:  # failed ÷ admitted (app.loadgen.stats)
        admitted = (~rejected[idx]).sum(axis=1)
        failed = admitted - ok[idx].sum(axis=1)
        met &= failed <= slo.failure_bound * np.maximum(admitted, 1)
    if slo.rejection_rate is not None:
        met &= rejected[idx].mean(axis=1) <= slo.rejection_rate
    return float(met.mean())


#: a level is decided early at this confidence (:func:`level_decided`)
DECIDE_CONFIDENCE = 0.95
#: … and not before this share of its request floor has been measured (a met verdict)
DECIDE_MIN_SHARE = 0.4


def breaking_count(n: int, q: float = 0.99) -> int:
    """How many of ``n`` values above a bound make their ``q``-percentile exceed it for
    certain: with numpy's linear percentile (the one app.loadgen.stats uses) the
    p99 sits at position h = q·(n − 1) of the sorted values, so once the value at
    ⌊h⌋ is above the bound, so is the p99: n − ⌊h⌋ values (2 for n ≤ 101)."""
    return max(1, n - math.floor(q * (n - 1) + 1e-9))


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _chi2_low(k: int, z: float = -1.645) -> float:
    """The 5 % quantile of χ² with ``k`` degrees of freedom (Wilson–Hilferty, 1931)."""
    a = 2.0 / (9.0 * k)
    return max(1e-9, k * (1.0 - a + z * math.sqrt(a)) ** 3)


def tail_probability(values: Sequence[float], bound: float) -> float:
    """An upper (≈ 95 %) estimate of the chance that one more request's value exceeds
    ``bound``: a log-normal fitted to ``values`` (s) with its mean log raised by its
    one-sided 95 % confidence limit (1.645·s/√n) and its spread by χ²'s (the 5 %
    quantile of n − 1 degrees of freedom). 1.0 with fewer than 3 positive values."""
    logs = [math.log(v) for v in values if v > 0]
    n = len(logs)
    if n < 3:
        return 1.0
    mu = sum(logs) / n
    sd = math.sqrt(sum((x - mu) ** 2 for x in logs) / (n - 1))
    mu_up = mu + 1.645 * sd / math.sqrt(n)
    sd_up = max(sd * math.sqrt((n - 1) / _chi2_low(n - 1)), 1e-6)
    return 1.0 - _normal_cdf((math.log(bound) - mu_up) / sd_up)


def level_decided(measured: Sequence[RequestRecord], slo: SLO, quota: int,
                  confidence: float = DECIDE_CONFIDENCE) -> bool | None:
    """Whether a search level's verdict is decided before its request floor ``quota``
    is reached, from its ``measured`` finished requests so far (those sent inside its
    window): False (broken) once a p99 bound is exceeded by :func:`breaking_count`
    (``quota``) requests or the failures pass ``slo.failure_rate`` × ``quota`` — certain:
    more requests only add to them; True (met) when ≥ :data:`DECIDE_MIN_SHARE` of the
    floor is measured, no request broke a bound (or failed, with a failure bound), and
    the chance that any of the floor's remaining requests would break one
    (:func:`tail_probability`, per bound, summed) is ≤ 1 − ``confidence``; None while
    undecided. A level stopped on it ends with ``stop_reason`` ``decided`` and is judged
    on the requests it measured, as any level (its p99 then meets or breaks the SLO as
    decided: none broke a bound, or enough did)."""
    if quota <= 0 or not measured:
        return None
    ok = [r for r in measured if r.ok]
    n_fail = len(measured) - len(ok)
    if slo.failure_bound is not None and n_fail > slo.failure_bound * quota:
        return False
    cols = {"ttft_p99": [r.ttft for r in ok if r.ttft is not None],
            "tpot_p99": [t for r in ok if (t := r.tpot) is not None],
            "e2e_p99": [r.e2e for r in ok if r.e2e is not None]}
    bounds = {k: getattr(slo, k) for k in cols if getattr(slo, k) is not None}
    need = breaking_count(quota)
    over = {k: sum(1 for v in cols[k] if v > b) for k, b in bounds.items()}
    if any(m >= need for m in over.values()):
        return False
    if not bounds or any(over.values()) or (n_fail and slo.failure_bound is not None):
        return None
    if len(measured) < max(3, DECIDE_MIN_SHARE * quota):
        return None
    left = quota - len(measured)
    if left <= 0:
        return None
    risk = sum(1.0 - (1.0 - tail_probability(cols[k], b)) ** left for k, b in bounds.items())
    return True if risk <= 1.0 - confidence else None


class CapacityLevel(BaseModel):
    """One probed level: ``users`` its concurrency (req/s in rate mode), ``met`` whether
    it met the SLO, ``requests`` the completed requests judged, ``few_requests`` True
    when that is below :data:`P99_MIN_REQUESTS`, ``met_probability`` the bootstrap's
    confidence in "met", ``repeat`` which repeat probed it, ``stats`` its StepStats."""

    users: float
    met: bool
    requests: int
    few_requests: bool
    met_probability: Optional[float] = None
    repeat: int = 0
    breaches: list[str] = []
    stats: dict


class Capacity(BaseModel):
    """The answer of a capacity search, in rig units. ``users``: the largest level that
    met the SLO (mean over repeats; 0 when even the lowest level broke it);
    ``users_low``/``users_high``: its interval; ``output_tps``, ``ttft_p99``,
    ``tpot_p99``, ``e2e_p99`` (s) and ``requests`` of that level (the last repeat's);
    ``limited_by``: what broke the SLO at the next level up (``ttft``, ``tpot``,
    ``e2e``, ``failures``, ``rejections``) or ``max_level`` when nothing did; ``next_users``: the
    lowest level that broke it; ``spread``: the repeats' standard deviation;
    ``shape``: the requests' shape (RampSpec.shape); ``sentence``: one line; ``levels``:
    every probed level."""

    mode: str = "concurrency"
    users: float
    users_low: float
    users_high: float
    next_users: Optional[float] = None
    output_tps: Optional[float] = None
    ttft_p99: Optional[float] = None
    tpot_p99: Optional[float] = None
    e2e_p99: Optional[float] = None
    requests: int = 0
    few_requests: bool = False
    limited_by: str = ""
    repeats: int = 1
    repeat_users: list[float] = []
    spread: Optional[float] = None
    slo: dict = {}
    shape: str = ""
    sentence: str = ""
    levels: list[CapacityLevel] = []


def _limited_by(st: StepStats | None, slo: SLO) -> str:
    if st is None:
        return "max_level"
    kinds = [b.split(" ", 1)[0].replace("_p99", "").replace("failure_rate", "failures")
             .replace("rejection_rate", "rejections") for b in st.slo_broken]
    if not kinds and st.n_ok == 0 and st.failure_rate == 0:  # no request finished inside the level
        kinds.append("e2e")
    if st.stop_reason == "failure_rate" or (slo.failure_bound is not None and st.failure_rate > slo.failure_bound):
        kinds.append("failures")
    return ", ".join(dict.fromkeys(kinds)) or "failures"


def few_requests(st: StepStats) -> bool:
    """Whether a level's p99 came from fewer than :data:`P99_MIN_REQUESTS` requests and
    was not decided early (:func:`level_decided`: stop reason ``decided``)."""
    return st.n_ok < P99_MIN_REQUESTS and st.stop_reason != "decided"


def level_met(st: StepStats, slo: SLO) -> bool:
    """Whether a probed level met every bound of ``slo``, its failure rate included. A
    level none of whose measured requests finished (each outlived the level: a fixed
    ramp's short step at a load it cannot serve) did not show it met a latency bound."""
    if st.slo_broken or slo_breaches(st, slo):
        return False
    if st.n_ok == 0 and any(getattr(slo, k) is not None for k in ("ttft_p99", "tpot_p99", "e2e_p99")):
        return False
    if st.stop_reason == "failure_rate":
        return False
    bound = slo.failure_bound
    return bound is None or st.failure_rate <= bound


def bracket(levels: Sequence[CapacityLevel]) -> tuple[CapacityLevel | None, CapacityLevel | None]:
    """One search's bracket (the levels of one repeat, any order): ``(C, B)`` — B the
    lowest level measured as broken, C the largest level measured as met below B (or
    below nothing when no level broke). Either is None when there is none. The
    capacity is C's users, its interval [C, B] (module docstring: the rule that an
    interval never passes a measurement of the same search); :func:`capacity_of` and
    :func:`crossing_users` both take it from here."""
    hi = min((lv for lv in levels if not lv.met), key=lambda lv: lv.users, default=None)
    lo = max((lv for lv in levels if lv.met and (hi is None or lv.users < hi.users)),
             key=lambda lv: lv.users, default=None)
    return lo, hi


def level_mark(st: StepStats) -> str:
    """The mark of a finished level in the progress chips: ``✗`` when it was aborted,
    stopped on failures or broke the SLO it ran under (``st.slo_broken``, judged by the
    runner in its own units: the sim's wall time or the rig's), else ``✓`` (met it, or
    completed when no SLO was set) — a chip never ticks a broken level."""
    return "✗" if st.stop_reason in ("aborted", "failure_rate") or st.slo_broken else "✓"


def fmt_users(x: float, mode: str = "concurrency") -> str:
    if mode == "rate":
        return f"{x:.3g} req/s"
    return f"{x:.1f}".rstrip("0").rstrip(".") + (" user" if x == 1 else " users")


def answer_text(users: float | None, mode: str = "concurrency", indicative: bool = False, *,
                cell: bool = False) -> str:
    """Users at the SLO as every front end writes the answer — one definition for the
    verdict's head (Results), History's "Users at SLO" cell (``cell``: the figure only)
    and the CLI: ``19 users at your SLO``; from a fixed ramp's short levels
    (app.run.verdict.is_indicative) ``≈4 users at your SLO (indicative)`` — never the
    plain figure. ``No SLO set`` (cell: ``–``) when None."""
    if users is None:
        return "–" if cell else "No SLO set"
    fig = f"{users:.3g}" if mode == "rate" else f"{users:g}"
    fig = ("≈" if indicative else "") + fig
    if cell:
        return fig + (" (indicative)" if indicative else "")
    what = "requests/s" if mode == "rate" else ("user" if users == 1 else "users")
    return f"{fig} {what} at your SLO" + (" (indicative)" if indicative else "")


def capacity_of(steps: Sequence[StepStats], records: Sequence[RequestRecord], slo: SLO,
                search: CapacitySearch, mode: str = "concurrency",
                repeats_of: dict[int, int] | None = None, seed: int = 0) -> Capacity:
    """The capacity from a finished search: ``steps`` (in the units the SLO is written
    in), the requests they were judged on (``records``, matched by ``level_idx``) and
    ``repeats_of`` (StepStats.idx → repeat; None → all repeat 0)."""
    repeats_of = repeats_of or {}
    levels: list[CapacityLevel] = []
    by_rep: dict[int, list[tuple[StepStats, CapacityLevel]]] = {}
    for st in steps:
        recs = judged_requests(st, records)
        met = level_met(st, slo)
        n = st.n_ok
        lv = CapacityLevel(users=st.level, met=met, requests=n, few_requests=few_requests(st),
                           met_probability=met_probability(recs, slo, seed=seed + st.idx),
                           repeat=repeats_of.get(st.idx, 0), breaches=list(st.slo_broken),
                           stats=st.model_dump(mode="json"))
        levels.append(lv)
        by_rep.setdefault(lv.repeat, []).append((st, lv))
    caps, lows, highs = [], [], []
    best_st: StepStats | None = None
    next_st: StepStats | None = None
    for rep in sorted(by_rep):
        pairs = by_rep[rep]
        lo, hi = bracket([lv for _, lv in pairs])
        cap = lo.users if lo is not None else 0.0
        caps.append(cap)
        lows.append(cap)
        highs.append(hi.users if hi is not None else cap)
        best_st = next((st for st, lv in pairs if lv is lo), None)
        next_st = next((st for st, lv in pairs if lv is hi), None)
    users = float(np.mean(caps)) if caps else 0.0
    if mode == "concurrency" and len(caps) == 1:
        users = caps[0]
    out = Capacity(
        mode=mode, users=users, users_low=min(lows, default=0.0), users_high=max(highs, default=0.0),
        next_users=next_st.level if next_st else None,
        output_tps=best_st.output_tps if best_st else None, ttft_p99=best_st.ttft_p99 if best_st else None,
        tpot_p99=best_st.tpot_p99 if best_st else None, e2e_p99=best_st.e2e_p99 if best_st else None,
        requests=best_st.n_ok if best_st else 0, few_requests=bool(best_st and few_requests(best_st)),
        limited_by=_limited_by(next_st, slo), repeats=len(caps), repeat_users=caps,
        spread=float(np.std(caps, ddof=1)) if len(caps) > 1 else None,
        slo=slo.model_dump(exclude_none=True), levels=levels)
    out.sentence = capacity_sentence(out)
    return out


def level_headroom(stats: dict, slo: dict) -> float | None:
    """How far a level sits inside its SLO: the smallest bound ÷ measured p99 over the
    latency bounds set (TTFT, TPOT, e2e) — ≥ 1 for a level that met them, < 1 for one
    that broke them (1.25: its tightest p99 is 20 % under its bound). ``stats``: a
    level's StepStats fields (``ttft_p99``… s), ``slo``: SLO fields. None when no latency
    bound was set or measured."""
    ratios = [slo[k] / stats[k] for k in ("ttft_p99", "tpot_p99", "e2e_p99")
              if slo.get(k) is not None and stats.get(k) is not None and stats[k] > 0]
    return min(ratios) if ratios else None


def crossing_users(c: Capacity) -> float | None:
    """Where between the capacity level L and the first level above it that broke the
    SLO (U) the tightest p99 crosses its bound, interpolated linearly in
    :func:`level_headroom` (h_L ≥ 1 > h_U): L + (U − L)·(h_L − 1)/(h_L − h_U), in [L, U).
    A search resolves whole users (or its resolution); two configurations that both
    resolve to L are told apart by it — the tuner's tie-break (app.tuner.tune) — using
    both levels' latencies rather than either alone. L when U is missing or broke on
    failures only; None when no level met the SLO. The last repeat's levels are used."""
    if c.users <= 0 or not c.levels:
        return None
    rep = max(lv.repeat for lv in c.levels)
    lo, hi = bracket([lv for lv in c.levels if lv.repeat == rep])
    if lo is None:
        return None
    h_lo = level_headroom(lo.stats, c.slo)
    h_hi = level_headroom(hi.stats, c.slo) if hi is not None else None
    if hi is None or h_lo is None or h_hi is None or h_hi >= 1.0 or h_lo <= h_hi:
        return lo.users
    frac = max(0.0, min(0.999, (h_lo - 1.0) / (h_lo - h_hi)))
    return lo.users + (hi.users - lo.users) * frac


def slo_text(slo: dict) -> str:
    """``{"ttft_p99": 2, "tpot_p99": 0.1}`` → ``TTFT p99 ≤ 2 s and TPOT p99 ≤ 100 ms``."""
    parts = []
    for k, name in (("ttft_p99", "TTFT p99"), ("tpot_p99", "TPOT p99"), ("e2e_p99", "e2e p99"),
                    ("ttfa_p99", "time to first answer token p99")):
        v = slo.get(k)
        if v is not None:
            parts.append(f"{name} ≤ {v * 1e3:.0f} ms" if v < 1 else f"{name} ≤ {v:g} s")
    if slo.get("failure_rate") is not None:
        parts.append(f"failures ≤ {slo['failure_rate'] * 100:g} %")
    if slo.get("rejection_rate") is not None:
        parts.append(f"rejected (HTTP 503) ≤ {slo['rejection_rate'] * 100:g} %")
    return " and ".join(parts) or "no SLO"


def capacity_sentence(c: Capacity) -> str:
    """The search's answer in one line (the verdict adds the rig, the model and flags)."""
    what = fmt_users(c.users, c.mode)
    if c.users <= 0:
        return f"No level met {slo_text(c.slo)}: even the lowest level probed broke it ({c.limited_by})."
    s = f"{what} at {slo_text(c.slo)}"
    if c.users_low != c.users or c.users_high != c.users:
        s += f" ({c.users_low:g}–{c.users_high:g}"
        s += f", {c.repeats} repeats)" if c.repeats > 1 else ")"
    elif c.repeats > 1:
        s += f" ({c.repeats} repeats)"
    if c.output_tps is not None:
        s += f" — {c.output_tps:.0f} output tok/s"
    if c.limited_by == "max_level":
        s += "; every level probed met it (the search's max_level was reached)"
    elif c.next_users is not None:
        s += f"; {fmt_users(c.next_users, c.mode)} broke it ({c.limited_by})"
    if c.few_requests:
        s += f"; p99 from {c.requests} requests (< {P99_MIN_REQUESTS})"
    return s + "."
