"""vLLM's data parallel load balancer: which engine (replica) a new request goes to.

With ``--data-parallel-size D`` vLLM runs D engine cores behind its front end, and the
front end's client picks one per request (vLLM 0.32.0
``vllm/v1/engine/core_client.py``, ``DPLBAsyncMPClient.get_core_engine_for_request``;
the counts come from the DP coordinator, ``vllm/v1/engine/coordinator.py``)::

    for idx in engines, starting at a rotating index:
        score = max(client_count · inflight[idx], waiting[idx] + running[idx])
        if waiting[idx]:
            score += waiting[idx] · 6 · max(0, kv_cache_usage[idx] − 0.5)
    pick the lowest score (the first of equal ones); then
    waiting[pick] += client_count            (until the next snapshot)
    start index += 1                         (rotates ties)

- ``waiting``, ``running``, ``kv_cache_usage``: the engines' scheduler figures as the
  coordinator last published them — at most every 100 ms
  (``min_stats_update_interval_ms = 100``), so between snapshots they are stale but
  raised by the client's own picks;
- ``inflight``: the client's exact count of its requests routed to the engine and not
  yet finished (decremented when the engine reports the request finished);
- older vLLMs (0.10–0.11) scored ``waiting · 4 + running`` from the same snapshot;
  this module follows 0.32, the version the sim follows.

The sim models one front-end client (``client_count`` 1): vLLM 0.32 starts D API
servers by default, each scaling its own in-flight count by D, which estimates the same
global load; which API server a connection lands on is the kernel's choice and is not
modelled (assumed). The snapshot is taken at the first pick at least
:data:`STATS_INTERVAL_S` after the previous one, from the engines' figures at that
moment (assumed: the coordinator publishes them on a 100 ms timer).

One mechanism for the simulated rig's HTTP server (app/sim) and the offline engine of
the planner's predictions (:func:`app.engine.offline.run_level`). Times in (rig) seconds.
"""
from __future__ import annotations

from typing import Callable, Sequence

#: seconds between the coordinator's snapshots of the engines' counts (vLLM 0.32
#: DPCoordinator ``min_stats_update_interval_ms`` = 100)
STATS_INTERVAL_S = 0.1
#: the weight of waiting requests per unit of KV cache usage above one half
#: (``waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)``, vLLM 0.32)
KV_PRESSURE_WEIGHT = 6.0

#: per engine: (waiting requests, running requests, KV cache usage 0–1)
EngineCounts = tuple[int, int, float]


class DpBalancer:
    """Routes requests over ``engines`` data parallel replicas with vLLM 0.32's rule
    (module docstring). Call :meth:`choose` when a request reaches the front end's
    engine client (after tokenization) and :meth:`finished` when its engine reports it
    finished or aborted. With one engine every request goes to engine 0."""

    def __init__(self, engines: int, client_count: int = 1, client_index: int = 0,
                 stats_interval_s: float = STATS_INTERVAL_S) -> None:
        if engines < 1:
            raise ValueError(f"engines {engines}: need at least 1")
        self.engines = engines
        self.client_count = client_count
        self.stats_interval_s = stats_interval_s
        #: the coordinator's last snapshot, [waiting, running, kv usage] per engine
        self.counts: list[list[float]] = [[0, 0, 0.0] for _ in range(engines)]
        self.inflight = [0] * engines
        self.start = engines * client_index // client_count
        self._snapshot_at = -float("inf")

    def choose(self, now: float, counts: Callable[[], Sequence[EngineCounts]] | None = None) -> int:
        """The engine index for a request routed at ``now`` (s). ``counts()`` gives every
        engine's (waiting, running, KV usage) now; it is read when a new snapshot is due."""
        n = self.engines
        if n == 1:
            self.inflight[0] += 1
            return 0
        if counts is not None and now - self._snapshot_at >= self.stats_interval_s:
            self.counts = [[w, r, kv] for w, r, kv in counts()]
            self._snapshot_at = now
        best, pick = float("inf"), 0
        for i in range(n):
            idx = (self.start + i) % n
            waiting, running, kv = self.counts[idx]
            score = max(self.client_count * self.inflight[idx], waiting + running)
            if waiting:
                score += waiting * KV_PRESSURE_WEIGHT * max(0.0, kv - 0.5)
            if score < best:
                best, pick = score, idx
        self.counts[pick][0] += self.client_count
        self.start = (self.start + 1) % n
        self.inflight[pick] += 1
        return pick

    def finished(self, engine: int) -> None:
        """A request routed to ``engine`` finished (or was aborted)."""
        if self.inflight[engine] > 0:
            self.inflight[engine] -= 1
