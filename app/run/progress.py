"""A ramp's progress as the window shows it (issue 37, item 2): the level in progress
(k, its users), its measured requests so far / needed, the time elapsed, the ETA and
the rig time spent — for a capacity search and for a fixed ramp alike.

Inputs arrive as the run controller reports them: the spec (rig seconds), each level's
start event (``t``: wall seconds on the session clock), its finished requests (wall
seconds) and each finished level's StepStats (rig seconds). ``time_scale`` is the
sim's k (wall × k = rig). Times returned are rig seconds unless named wall.

The ETA of a search: what the level in progress still needs (its requests left at the
rate it measures them, else a finished level's duration) plus the expected levels left
(:func:`app.loadgen.capacity.levels_left`) × the mean rig duration of the levels done
(or of the current one, estimated). A fixed ramp: its levels left × warm-up + step.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from app.loadgen.capacity import level_met, levels_left
from app.loadgen.records import RequestRecord
from app.loadgen.spec import RampSpec
from app.loadgen.stats import StepStats


def clock_text(s: float | None) -> str:
    """Seconds as ``m:ss`` (``h:mm:ss`` from an hour); ``–`` for None or not finite."""
    if s is None or not math.isfinite(s):
        return "–"
    s = int(round(max(0.0, s)))
    h, m = divmod(s, 3600)
    m, sec = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class RampProgress:
    """The progress of one ramp (module docstring). ``t0``: the wall instant (session
    clock) the ramp started."""

    def __init__(self, spec: RampSpec, time_scale: float = 1.0, t0: float = 0.0) -> None:
        self.spec = spec
        self.k = time_scale or 1.0
        self.t0 = t0
        self.done: list[StepStats] = []
        self.level: dict[str, Any] | None = None
        self.recs: list[RequestRecord] = []

    # ------------------------------------------------------------------ events
    def level_started(self, ev: dict) -> None:
        self.level = ev
        self.recs = []

    def add(self, records: Sequence[RequestRecord]) -> None:
        """Finished requests (wall seconds); those of the level in progress are kept."""
        if self.level is None:
            return
        idx = self.level.get("idx")
        self.recs.extend(r for r in records if r.level_idx == idx)

    def level_done(self, st: StepStats) -> None:
        self.done = [s for s in self.done if s.idx != st.idx] + [st]
        if self.level is not None and self.level.get("idx") == st.idx:
            self.level = None

    # ------------------------------------------------------------------ figures
    @property
    def needed(self) -> int | None:
        """The measured requests the level in progress stops at (None: it runs on time)."""
        if self.level is None:
            return None
        return self.spec.level_quota(float(self.level.get("level", 0)))

    def measured(self) -> tuple[int, float | None]:
        """``(requests measured so far, wall instant its window opened)`` of the level in
        progress: a settling level's window opens once each of its users finished one
        request (app.loadgen.runner), then after the warm-up; (0, None) before."""
        if self.level is None:
            return 0, None
        lv = float(self.level.get("level", 0))
        t_level = float(self.level.get("t", 0.0))
        w0 = t_level + self.spec.warmup_seconds / self.k
        if self.level.get("settles"):
            n = int(lv)
            ends = sorted(r.t_end for r in self.recs)
            if len(ends) < n:
                return 0, None
            w0 = max(w0, ends[n - 1])
        return sum(1 for r in self.recs if r.t_start >= w0), w0

    def rig_spent(self, now: float) -> float:
        """Rig seconds the ramp's levels have taken so far (the level in progress too)."""
        s = sum(st.t_end - st.t_start for st in self.done)
        if self.level is not None:
            s += max(0.0, now - float(self.level.get("t", now))) * self.k
        return s

    def _level_left(self, now: float) -> float | None:
        """Rig seconds the level in progress still needs (None: not known yet)."""
        if self.level is None:
            return 0.0
        el = max(0.0, now - float(self.level.get("t", now))) * self.k
        need = self.needed
        cap = (self.spec.warmup_seconds or 0) + (self.spec.step_seconds or math.inf)
        if need is None:
            return max(0.0, cap - el) if math.isfinite(cap) else None
        got, w0 = self.measured()
        if got >= 3 and w0 is not None and now > w0:
            rate = got / ((now - w0) * self.k)  # measured requests per rig second
            return min(max(0.0, (need - got) / rate), max(0.0, cap - el))
        if self.done:  # not measuring yet: as long as the levels done took, less what this one has
            return max(0.0, self._mean_level_s() - el)
        return None

    def _mean_level_s(self) -> float:
        return sum(st.t_end - st.t_start for st in self.done) / len(self.done)

    def levels_after(self) -> float:
        """Levels expected after the one in progress."""
        sp = self.spec
        if sp.search is None:
            return max(0, len(sp.level_values) - len(self.done) - (1 if self.level is not None else 0))
        rep = max((getattr(st, "repeat", 0) for st in self.done), default=0)
        hist = [(st.level, level_met(st, sp.slo)) for st in self.done if getattr(st, "repeat", 0) == rep]
        left = levels_left(sp.search, hist, sp.mode)
        return max(0.0, left - (1 if self.level is not None else 0))

    def eta_s(self, now: float) -> float | None:
        """Rig seconds until the ramp ends (module docstring); None while unknown."""
        cur = self._level_left(now)
        if cur is None:
            return None
        after = self.levels_after()
        if after <= 0:
            return cur
        if self.done:
            per = self._mean_level_s()
        elif self.level is not None:
            el = max(0.0, now - float(self.level.get("t", now))) * self.k
            per = el + cur
        else:
            return None
        return cur + after * per

    def text(self, now: float) -> str:
        """One line: ``level 3 (23 users): 57/100 requests · 1:12 elapsed · ETA 2:30 ·
        rig time 4:10 (sim ×4)`` — elapsed wall, the ETA in wall time (rig ÷ k), rig time
        spent."""
        parts = []
        if self.level is not None:
            k_ = int(self.level.get("idx", 0)) + 1
            lv = float(self.level.get("level", 0))
            of = "" if self.spec.search is not None else f"/{len(self.spec.level_values)}"
            what = f"{lv:.3g} req/s" if self.level.get("mode") == "rate" else fmt_level(lv)
            head = f"level {k_}{of} ({what})"
            need = self.needed
            if need is not None:
                got, w0 = self.measured()
                head += f": {got}/{need} requests" if w0 is not None else f": settling ({len(self.recs)}/{int(lv)} users' first)"
            parts.append(head)
        parts.append(f"{clock_text(now - self.t0)} elapsed")
        eta = self.eta_s(now)
        parts.append(f"ETA {clock_text(eta / self.k) if eta is not None else '–'}")
        rig = f"rig time {clock_text(self.rig_spent(now))}"
        if self.k != 1.0:
            rig += f" (sim ×{self.k:g})"
        parts.append(rig)
        return " · ".join(parts)

    def summary(self, now: float) -> str:
        """What a finished ramp took: ``6 levels in 1:12 · rig time 4:48 (sim ×4)``."""
        rig = f"rig time {clock_text(self.rig_spent(now))}" + (f" (sim ×{self.k:g})" if self.k != 1.0 else "")
        n = len(self.done)
        return f"{n} level{'' if n == 1 else 's'} in {clock_text(now - self.t0)} · {rig}"


def fmt_level(users: float) -> str:
    return f"{users:g} user" + ("" if users == 1 else "s")
