"""Issue 15, item 5, as an attack: ``cleanup --yes`` must never end another live session's
server, and must find the server whose vLLM Dyno is gone (app.server.procs). The servers
are sim servers (real processes) started through two run controllers; the leftover is a
server that ignores SIGTERM and whose reaper was SIGKILLed (a hung server: the SIGTERM the
kernel sends it when the reaper dies does not end it, and nothing else does)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from app.cli import main
from app.config import ServerConfig
from app.helper_process import helper_argv
from app.run.controller import LaunchTarget, RunController
from app.server import procs
from app.server.procs import LeftoverProcess, end_leftovers, find_leftovers
from app.server.reaper import OWNER_ENV

SIM = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1", "--sim-time-scale", "20", "--sim-seed", "1"]


def _sim_target() -> LaunchTarget:
    cfg = ServerConfig(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=4096)
    return LaunchTarget(engine="sim", config=cfg, sim_args=SIM, telemetry=False, grace=2.0)


def _orphan_by_killed_reaper() -> tuple[int, int]:
    """A server that ignores SIGTERM, started by a real reaper whose reaper is then
    SIGKILLed (its app side is gone; the reaper's death signal, SIGTERM, does not end it).
    Returns (server pid, process group)."""
    hung = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
    r = subprocess.Popen(helper_argv("app.server.reaper") + ["--env-stdin", "--", sys.executable, "-c", hung],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    r.stdin.write(b'{"env": {"VLLM_DYNO_TEST": "orphan"}}\n')
    r.stdin.flush()
    line = r.stderr.readline().decode()
    assert line.startswith("DYNO_REAPER server_pid="), line
    server = int(line.strip().split("=")[1])
    assert r.stdout.readline().strip() == b"up"
    r.kill()
    r.wait(10)
    r.stdin.close()
    return server, r.pid


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _by_pid() -> dict[int, LeftoverProcess]:
    return {p.pid: p for p in find_leftovers()}


def test_cleanup_ends_only_the_server_whose_owner_is_gone(capsys, monkeypatch):
    ctls = [RunController(store=lambda: None), RunController(store=lambda: None)]
    orphan = pgid = unmanaged = None
    try:
        for c in ctls:
            assert c.launch(_sim_target(), check_leftovers=False) == []
        for c in ctls:
            assert c.wait_ready(60), c.failure
        live = [c.supervisor.server_pid for c in ctls]
        orphan, pgid = _orphan_by_killed_reaper()
        # a vLLM process not started by vLLM Dyno (title as vLLM's engine core sets it)
        unmanaged = subprocess.Popen(["VLLM::EngineCore", "120"], executable="/bin/sleep")

        found = _by_pid()
        for pid in live:
            assert found[pid].kind == "owned" and not found[pid].endable
            assert found[pid].owner_pid == os.getpid()  # the app: the reaper's parent
            assert f"owned by a running vLLM Dyno (pid {os.getpid()})" == found[pid].describe()
        assert found[orphan].kind == "orphaned" and found[orphan].endable
        assert found[unmanaged.pid].kind == "unmanaged" and not found[unmanaged.pid].endable
        assert os.getpid() not in found

        # the leftover check before a launch offers only the orphan (every process "holds" GPU memory here)
        class AllOnGpu(dict):
            def get(self, pid, default=None):
                return 2**30

        monkeypatch.setattr(procs, "gpu_memory_by_pid", lambda nvml=None: AllOnGpu())
        third = RunController(store=lambda: None)
        offered = third.launch(_sim_target())
        assert orphan in [p.pid for p in offered] and not set(live + [unmanaged.pid]) & {p.pid for p in offered}
        assert third.supervisor is None
        monkeypatch.undo()

        # a forged list cannot end a live session's server: each pid is classified again
        forged = [LeftoverProcess(pid, "x", 0, None, "orphaned") for pid in live]
        assert end_leftovers(forged, grace=1.0) == []

        assert main(["cleanup", "--yes"]) == 0
        out = capsys.readouterr().out
        assert "owned by a running vLLM Dyno" in out and "not started by vLLM Dyno" in out and "Traceback" not in out
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
        for c, pid in zip(ctls, live):
            assert psutil.pid_exists(pid) and c.supervisor.state.value == "ready"
        assert unmanaged.poll() is None  # --yes alone never ends it
        assert end_leftovers([_by_pid()[unmanaged.pid]], include_unmanaged=True, grace=1.0) == []
        assert unmanaged.wait(5) is not None
    finally:
        for c in ctls:
            assert c.close() == []
        if pgid is not None:
            _kill_group(pgid)
        if unmanaged is not None and unmanaged.poll() is None:
            unmanaged.kill()
            unmanaged.wait(5)


@pytest.mark.parametrize("marker", ["dead", "reused", "garbage"])
def test_a_marker_whose_owner_is_gone_is_a_leftover(marker):
    """Owner markers of a dead pid, of a live pid with another start time (pid reuse), or
    malformed: the process is a leftover; a pid reused since the scan is never ended."""
    if marker == "dead":
        p = subprocess.Popen([sys.executable, "-c", "pass"])
        p.wait()
        value = f"{p.pid}:1"
    elif marker == "reused":
        value = f"{os.getpid()}:1"  # this process, but it started at another tick
    else:
        value = "not-a-pid"
    env = dict(os.environ, **{OWNER_ENV: value})
    s = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while s.pid not in _by_pid() and time.monotonic() < deadline:
            time.sleep(0.05)
        lp = _by_pid()[s.pid]
        assert lp.kind == "orphaned"
        stale = LeftoverProcess(lp.pid, lp.title, 0, None, "orphaned", None, lp.create_time - 5)
        assert end_leftovers([stale], grace=1.0) == [] and s.poll() is None  # not the same process
        assert end_leftovers([lp], grace=1.0) == []
        assert s.wait(5) is not None
    finally:
        if s.poll() is None:
            s.kill()
            s.wait(5)
