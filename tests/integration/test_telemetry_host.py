"""The host sampler against a real process tree started by the test."""
from __future__ import annotations

import subprocess
import sys
import time

from app.server.procs import kill_group, wait_group_gone
from app.telemetry.host_sampler import HostSampler, group_pids, tree_pids

# a parent that starts a child holding ~40 MB, then both sleep
CHILD = "import time; b = bytearray(40 * 2**20); time.sleep(60)"
PARENT = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {CHILD!r}]); time.sleep(60)"


def _start_tree():
    p = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True)
    deadline = time.monotonic() + 20
    while len(tree_pids(p.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return p


def test_server_tree_by_pgid_and_root_pid():
    p = _start_tree()
    try:
        assert len(group_pids(p.pid)) == 2 and len(tree_pids(p.pid)) == 2
        for kw in ({"pgid": p.pid}, {"root_pid": p.pid}):
            hs = HostSampler(interval=1.0, **kw)
            deadline = time.monotonic() + 20
            while True:  # the child needs a moment to touch its 40 MB
                out = {(s.source, s.name): s.value for s in hs.tick()}
                if out[("server", "rss_bytes")] > 40 * 2**20 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert out[("server", "processes")] == 2
            assert out[("server", "rss_bytes")] > 40 * 2**20
            assert out[("server", "cpu_pct")] >= 0
            assert out[("host", "memory_total_bytes")] > out[("host", "memory_available_bytes")] > 0
            assert 0 <= out[("host", "cpu_pct")] <= 100
            assert hs.latest["server.processes"] == 2
    finally:
        kill_group(p.pid)
        p.wait(10)
        assert wait_group_gone(p.pid, 5) == []
    hs = HostSampler(pgid=p.pid)
    out = {(s.source, s.name): s.value for s in hs.tick()}
    assert out[("server", "processes")] == 0 and out[("server", "rss_bytes")] == 0


def test_no_server_means_host_only():
    out = HostSampler().tick()
    assert {s.source for s in out} == {"host"}
