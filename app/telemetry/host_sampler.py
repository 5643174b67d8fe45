"""The host sampler (psutil): the machine and the server's process tree.

Samples (names declared in :mod:`app.telemetry.names`), source ``host``: ``cpu_pct``
(all cores, 0–100), ``memory_used_bytes``, ``memory_available_bytes``,
``memory_total_bytes``. Source ``server`` (when a server is set): ``rss_bytes`` (sum of resident set sizes), ``cpu_pct`` (sum of per-process CPU %,
100 = one full core — how the CPU build and CPU offload show), ``processes`` (count).

The server tree is every live process in process group ``pgid`` (the supervisor's
group, which holds the reaper, the API server, its engine core and workers) and/or the
process ``root_pid`` with all its descendants. Processes that vanish between listing
and reading are skipped. RSS counts shared pages once per process (psutil/Linux RSS),
so the sum can exceed the true footprint.
"""
from __future__ import annotations

import logging
import os

import psutil

from app.clock import SessionClock
from app.telemetry.names import HOST_SERIES, SERVER_SERIES
from app.telemetry.periodic import PeriodicSampler
from app.telemetry.series import Sample

log = logging.getLogger(__name__)


def group_pids(pgid: int) -> set[int]:
    """Pids whose process group is ``pgid`` (Linux/macOS; empty where getpgid fails)."""
    out = set()
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                out.add(pid)
        except OSError:
            continue
    return out


def tree_pids(root_pid: int) -> set[int]:
    """``root_pid`` and all its descendants (empty when it is gone)."""
    try:
        root = psutil.Process(root_pid)
        return {root_pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


class HostSampler(PeriodicSampler):
    """Samples the host every ``interval`` seconds (default 1 s).

    ``pgid`` / ``root_pid``: the server tree (either, both or neither; settable later,
    e.g. once the supervisor has started). ``latest``: the newest values by sample name
    (``host.*`` and ``server.*``).
    """

    name = "host-sampler"

    def __init__(self, pgid: int | None = None, root_pid: int | None = None, interval: float = 1.0,
                 clock: SessionClock | None = None) -> None:
        super().__init__(interval, clock)
        self.pgid = pgid
        self.root_pid = root_pid
        self.latest: dict[str, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(None)  # prime: the first call measures from here

    def server_pids(self) -> set[int]:
        pids: set[int] = set()
        if self.pgid is not None:
            pids |= group_pids(self.pgid)
        if self.root_pid is not None:
            pids |= tree_pids(self.root_pid)
        return pids

    def tick(self) -> list[Sample]:
        """One round; returns host samples and, with a server set, the tree's."""
        cpu = psutil.cpu_percent(None)
        vm = psutil.virtual_memory()
        t = self.clock.now()
        # in the order of app.telemetry.names.HOST_SERIES / SERVER_SERIES
        out = [Sample(t, "host", name, float(v))
               for name, v in zip(HOST_SERIES, (cpu, vm.used, vm.available, vm.total), strict=True)]
        if self.pgid is not None or self.root_pid is not None:
            out += [Sample(t, "server", name, float(v)) for name, v in zip(SERVER_SERIES, self._tree(), strict=True)]
        self.latest = {f"{s.source}.{s.name}": s.value for s in out}
        return out

    def _tree(self) -> tuple[int, float, int]:
        pids = self.server_pids()
        procs = self._procs
        for gone in set(procs) - pids:
            del procs[gone]
        rss, pct, n = 0, 0.0, 0
        for pid in pids:
            p = procs.get(pid)
            try:
                if p is None:
                    p = procs[pid] = psutil.Process(pid)
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    rss += p.memory_info().rss
                    pct += p.cpu_percent(None)  # first call per process gives 0.0 (psutil)
                n += 1
            except psutil.Error:
                procs.pop(pid, None)
        return rss, pct, n
