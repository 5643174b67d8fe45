"""Issue 15, the kill-order matrix's main cells against the real CPU build of vLLM (the
tiny local model, the built-in *CPU tiny model* profile through ``vllm-dyno run``), with
the assertions of tests/integration/test_kill_matrix.py: zero processes left within the grace + 5 s,
no traceback, the run stored with the right status, a partial level kept, and a SIGKILLed
app losing no completed record beyond the store's bound. Plus the kill order that left a
permanent orphan (the reaper, then the app): vLLM's engine core is the process that does
not notice its parent's death, so only a real vLLM shows that the server's own SIGTERM
(PR_SET_PDEATHSIG) takes it down.

Launch budget: three real vLLM launches (≈ 1 min each on 2 cores). The app's Ctrl-C
mid-ramp is the sim's cell (tests/integration/test_kill_matrix.py: the partial level, the
stored status); that a Ctrl-C of the app takes a real vLLM's whole group down within the
stop grace is shown by `vllm-dyno serve`'s Ctrl-C (tests/e2e/test_supervisor_e2e.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from app.server.procs import group_members, wait_group_gone
from app.server.reaper import EOF_GRACE_S
from tests.conftest import ROOT
from tests.integration.test_kill_matrix import run_cell


#: the stop grace `vllm-dyno run` gives a vLLM server (SIGTERM → SIGKILL), seconds
STOP_GRACE_S = 20.0


# the app-SIGKILL cell is not `launches`: it judges the store's loss bound in tenths of a
# second, measured with nothing else running; the server-SIGKILL cell judges the stop
# grace's seconds and the status only (Makefile: `make test`)
@pytest.mark.parametrize("target, sig", [("app", signal.SIGKILL),
                                         pytest.param("server", signal.SIGKILL, marks=pytest.mark.launches)],
                         ids=["app-SIGKILL", "server-SIGKILL"])
def test_main_cells_mid_ramp_on_the_real_cpu_build(target, sig, tmp_path, tiny_model, vllm_python):
    args = ["run", "CPU tiny model", "--python", vllm_python, "--levels", "2,4", "--step-seconds", "5"]
    grace = EOF_GRACE_S if (target, sig) == ("app", signal.SIGKILL) else STOP_GRACE_S
    cell = run_cell(target, "mid-ramp", sig, tmp_path, args=args, gone_within=grace + 5.0, startup_s=600.0,
                    mid_s=3.0)  # level 4 runs ≥ 5 s: its users have finished requests by then
    print(f"{cell.name}: nothing left after {cell.gone_s:.2f} s" + (
        f"; newest stored completion {cell.lost_s:.3f} s before the kill; the server had finished "
        f"{cell.finished} of the ramp's requests by the kill minus the bound, {cell.stored} stored"
        if cell.lost_s is not None else ""))
    assert not cell.problems, cell.name + ":\n  " + "\n  ".join(cell.problems) + "\n--- output ---\n" + cell.output[-4000:]
    if target == "server":
        status = next(l for l in cell.output.splitlines() if l.startswith("status: "))
        # vLLM's own ulimit warning (a hard limit under 65535) is in the log, never the cause
        assert status == ("status: server_failed — the server was killed (signal 9 — out of memory?) after it was "
                          "ready"), status


OWNER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from tests.conftest import tiny_server_config
    from app.server.supervisor import Supervisor
    sup = Supervisor(tiny_server_config(Path({model!r})), python={python!r}, startup_timeout=600)
    sup.start()
    assert sup.wait_ready(620), sup.failure
    print(sup.pgid, sup.server_pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.launches  # its own vLLM; it judges the stop grace's seconds, no loss bound (Makefile: `make test`)
def test_the_reaper_then_the_app_killed_leaves_no_vllm_process(tiny_model, vllm_python):
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT), model=str(tiny_model),
                                                                 python=vllm_python)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pgid = None
    try:
        pgid, server = map(int, owner.stdout.readline().split())
        members = {p.pid: " ".join(p.cmdline()[:2]) for p in group_members(pgid)}
        assert any(t.startswith("VLLM::") for t in members.values()), members  # the engine core is up
        os.kill(pgid, signal.SIGKILL)  # the reaper
        os.kill(owner.pid, signal.SIGKILL)  # then the app
        owner.wait(10)
        t0 = time.monotonic()
        left = wait_group_gone(pgid, STOP_GRACE_S + 5.0)
        took = time.monotonic() - t0
        print(f"reaper then app SIGKILLed: the vLLM group ({len(members)} processes) gone after {took:.2f} s")
        assert left == [], f"left {[(p.pid, members.get(p.pid)) for p in left]} after {took:.1f} s"
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
        if pgid is not None and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)
