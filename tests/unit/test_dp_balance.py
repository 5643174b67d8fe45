"""vLLM's data parallel load balancer (app.engine.balance, the rule of vLLM 0.32.0
vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request) and the
offline engine routing with it, as the sim's server does — rig time, no processes."""
from __future__ import annotations

from app.engine.balance import STATS_INTERVAL_S, DpBalancer
from app.engine.offline import run_level
from app.engine.scheduler import Scheduler


def test_the_least_loaded_engine_by_waiting_plus_running():
    b = DpBalancer(3)
    assert b.choose(0.0, lambda: [(0, 5, 0.2), (0, 2, 0.2), (1, 3, 0.2)]) == 1
    # the pick counts as waiting on engine 1 until the next snapshot: 3 = 3 + 0 → engine 2 ties, 0 stays higher
    assert b.counts[1] == [1, 2, 0.2]


def test_waiting_requests_weigh_more_on_a_kv_bound_engine():
    """score += waiting · 6 · max(0, kv usage − 0.5): at 90 % KV usage two waiting
    requests weigh 2 + 4.8 more; at 50 % they count once."""
    assert DpBalancer(2).choose(0.0, lambda: [(2, 2, 0.9), (0, 6, 0.9)]) == 1  # 4 + 4.8 > 6
    assert DpBalancer(2).choose(0.0, lambda: [(2, 2, 0.5), (0, 6, 0.5)]) == 0  # 4 < 6


def test_a_burst_spreads_round_robin_and_ties_rotate():
    b = DpBalancer(3)
    idle = [(0, 0, 0.0)] * 3
    picks = [b.choose(0.0, lambda: idle) for _ in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    assert b.inflight == [2, 2, 2]


def test_the_in_flight_floor_and_the_stale_snapshot():
    """Between snapshots (100 ms) the client's own in-flight count is the floor: a
    finished request frees its engine only in that count; the next snapshot shows the
    engines' real figures."""
    b = DpBalancer(2)
    idle = [(0, 0, 0.0)] * 2
    assert [b.choose(0.0, lambda: idle) for _ in range(4)] == [0, 1, 0, 1]
    b.finished(0)
    b.finished(0)
    # the snapshot still says 2 waiting on each (the client's own increments): a tie, rotated
    assert b.choose(0.01, lambda: [(0, 0, 0.0), (0, 2, 0.0)]) == 0
    # a new snapshot after STATS_INTERVAL_S: engine 0 has one request (just routed), engine 1 two
    assert b.choose(0.01 + STATS_INTERVAL_S, lambda: [(0, 1, 0.0), (0, 2, 0.0)]) == 0
    assert b.inflight == [2, 2]


def test_one_engine_takes_everything():
    b = DpBalancer(1)
    assert {b.choose(t / 10) for t in range(10)} == {0}


def _sched():
    return Scheduler(1000, 4, 256, lambda b, c, n, a: 0.01 + 1e-5 * n)


def test_the_offline_engine_routes_with_the_balancer():
    """run_level routes each request when it reaches the front end: a burst of users
    spreads over the replicas, every replica's share stays within one request of the
    others', and each flight records its engine."""
    lv = run_level(_sched, 6, lambda: (32, 10), step_s=3.0, engines=3, request_overhead_s=0.005)
    first = sorted(lv.flights[:6], key=lambda f: f.req.arrival)
    assert [f.engine for f in first] == [0, 1, 2, 0, 1, 2]
    per = [sum(1 for f in lv.flights if f.engine == e) for e in range(3)]
    assert max(per) - min(per) <= 1 and sum(per) == len(lv.flights)


def test_uneven_requests_go_to_the_engine_with_room():
    """With long and short requests mixed, routing by load is not u mod D: a user's next
    request goes to the replica with the fewest requests (as the snapshot, at most
    100 ms old, and the in-flight counts show it), so both replicas hold about half the
    requests over time (vLLM balances request counts, not tokens)."""
    lengths = iter([(32, 200), (32, 5), (32, 5)] * 10_000)
    lv = run_level(_sched, 4, lambda: next(lengths), step_s=20.0, engines=2, request_overhead_s=0.005)
    assert not all(f.engine == f.user % 2 for f in lv.flights)
    held = [sum(f.tokens[-1] - f.req.arrival for f in lv.flights if f.engine == e) for e in range(2)]
    assert abs(held[0] - held[1]) < 0.05 * sum(held)  # request-seconds per replica
