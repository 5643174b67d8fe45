"""The ramp's progress line (app.run.progress, issue 37 item 2): level k, requests so far /
needed, elapsed, ETA and rig time, for a capacity search from the plan and a fixed ramp."""
from __future__ import annotations

from app.loadgen.records import RequestRecord
from app.loadgen.spec import SLO, CapacitySearch, RampSpec
from app.loadgen.stats import StepStats
from app.run.progress import RampProgress, clock_text


def _rec(idx: int, t: float, e2e: float = 10.0) -> RequestRecord:
    return RequestRecord(level_idx=idx, level=20, t_start=t, ttft=0.5, e2e=e2e, output_tokens=10)


def _step(idx: int, level: float, rig_s: float, broke: bool) -> StepStats:
    return StepStats(idx=idx, level=level, t_start=0.0, t_end=rig_s, window_start=0.0, window_end=rig_s,
                     window_s=rig_s, n_ok=100, slo_broken=["ttft_p99 3 s > 2 s"] if broke else [])


def test_a_search_level_counts_its_measured_requests_and_the_eta_follows_the_tree():
    spec = RampSpec(url="http://x", slo=SLO(ttft_p99=2.0), requests_per_level=100, step_seconds=600,
                    search=CapacitySearch.from_prediction(20, max_level=128))
    p = RampProgress(spec, time_scale=4.0, t0=100.0)
    p.level_started({"idx": 0, "level": 20.0, "t": 100.0, "settles": True, "mode": "concurrency"})
    p.add([_rec(0, 100.0 + i * 0.05, e2e=1.0) for i in range(19)])
    assert p.measured() == (0, None) and "settling (19/20" in p.text(101.0)
    p.add([_rec(0, 100.1, e2e=2.5)])  # the 20th user's first request ends at 102.6: the window opens
    p.add([_rec(0, 102.6 + i * 0.25, e2e=3.0) for i in range(40)])  # 40 measured in 10 wall s
    got, w0 = p.measured()
    assert got == 40 and w0 == 102.6
    # 40 requests in 10 wall s = 40 rig s at ×4: 60 more take 60 rig s; then 1.5 levels expected
    # after it (from 20: 25 either way, then 22 or 17/18 …) at this level's length
    left = p._level_left(112.6)
    assert abs(left - 60.0) < 1e-6
    eta = p.eta_s(112.6)
    assert eta is not None and eta > left and p.levels_after() >= 1
    line = p.text(112.6)
    assert line.startswith("level 1 (20 users): 40/100 requests · 0:13 elapsed · ETA ")
    assert line.endswith("rig time 0:50 (sim ×4)")
    p.level_done(_step(0, 20, 60.0, broke=False))
    p.level_started({"idx": 1, "level": 25.0, "t": 116.0, "settles": True, "mode": "concurrency"})
    assert p.rig_spent(117.0) == 64.0
    p.level_done(_step(1, 25, 40.0, broke=True))
    p.level_started({"idx": 2, "level": 22.0, "t": 126.0, "settles": True, "mode": "concurrency"})
    assert p.levels_after() == 0  # 20 met, 25 broke: 22 is the last probe (20–22 resolved either way)
    assert "6 levels" not in p.summary(140.0) and p.summary(140.0).startswith("2 levels in 0:40 · rig time")


def test_a_fixed_ramp_counts_its_levels_and_time():
    spec = RampSpec(url="http://x", levels=[1, 2, 4, 8], step_seconds=20, warmup_seconds=0)
    p = RampProgress(spec, time_scale=1.0, t0=0.0)
    p.level_started({"idx": 0, "level": 1.0, "t": 0.0, "mode": "concurrency"})
    assert p.needed is None and p.levels_after() == 3
    assert p.eta_s(5.0) == 15.0 + 3 * 20.0  # the level's 15 s left + 3 levels of 20 s
    assert p.text(5.0) == "level 1/4 (1 user) · 0:05 elapsed · ETA 1:15 · rig time 0:05"
    assert clock_text(3725) == "1:02:05" and clock_text(None) == "–"
