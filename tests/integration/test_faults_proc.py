"""Issue 15, items 6–9 and 11, each as the fault it is: two launches on one port, a killed
reaper (alone, and then the app), a SIGKILLed writer of the run store, a Ctrl-C during
``vllm-dyno run``, a SIGKILLed server whose log carries vLLM's ulimit warning, and a level
whose requests mostly fail. Real processes throughout (sim servers, reapers, the CLI, the
load generator), real SQLite; the kill-order matrix is tests/integration/test_kill_matrix.py."""
from __future__ import annotations

import errno
import os
import random
import resource
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest

from app.cli.common import PARTIAL_MARK, level_table
from app.config import ServerConfig
from app.loadgen.capacity import capacity_of, level_met
from app.loadgen.generator import run_ramp
from app.loadgen.spec import DEFAULT_FAILURE_RATE, SLO, CapacitySearch, RampSpec
from app.loadgen.stats import slo_breaches
from app.planner.diagnose import killed_diagnosis, oom_records, read_kernel_log
from app.run.controller import LaunchTarget, RunController
from app.run.events import State
from app.server.launch import LaunchError
from app.server.procs import group_members, wait_group_gone
from app.server.reaper import EOF_GRACE_S
from app.store import INTERRUPTED, LOSS_BOUND_S, RunStore
from tests.app_process import CRASH_RE, AppProcess, sim_profile
from tests.conftest import ROOT
from tests.loadgen_server import Script, ScriptedServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _sim(port: int | None = None, k: float = 20) -> LaunchTarget:
    cfg = ServerConfig(model=MODEL, max_model_len=4096, port=port)
    rig = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1", "--sim-time-scale", str(k), "--sim-seed", "1"]
    return LaunchTarget("sim", cfg, sim_args=rig, telemetry=False, grace=2.0)


def _wait(cond, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:g} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------------- item 6: one port, two launches
def test_a_second_launch_on_a_busy_port_is_refused_naming_the_port_and_its_holder():
    first, second = RunController(store=lambda: None), RunController(store=lambda: None)
    try:
        assert first.launch(_sim(), check_leftovers=False) == []
        assert first.wait_ready(60), first.failure_text
        port, holder = first.supervisor.config.port, first.supervisor.server_pid
        with pytest.raises(LaunchError) as e:
            second.launch(_sim(port), check_leftovers=False)
        msg = str(e.value)
        assert f"port {port} on 127.0.0.1 is already in use by pid {holder} (" in msg and "app.sim.server" in msg
        assert "choose another --port" in msg
        assert second.supervisor is None and second.state == State.FAILED and not second.ready
        assert first.ready and first.supervisor.state.value == "ready"  # the first one is untouched
    finally:
        assert first.close() == [] and second.close() == []


def test_a_launch_while_another_loads_on_that_port_is_refused():
    """The first server binds its port only after loading (the sim, like vLLM, listens
    once ready): until then the launch's reservation holds the port, and a second launch
    on it fails at once, naming the loading server — it used to become "ready" on the
    first one's /health."""
    first, second = RunController(store=lambda: None), RunController(store=lambda: None)
    try:
        assert first.launch(_sim(k=1), check_leftovers=False) == []  # loads for ≈ 20 s
        sup = first.supervisor
        _wait(lambda: sup.server_pid is not None, 30, "the first server starts")
        port = sup.config.port
        with pytest.raises(LaunchError) as e:
            second.launch(_sim(port), check_leftovers=False)
        msg = str(e.value)
        assert f"port {port} on 127.0.0.1 is already in use by pid {sup.server_pid} (" in msg
        assert "a server that has not started listening yet" in msg, msg
        assert first.state in (State.STARTING, State.LOADING)
    finally:
        assert first.close() == [] and second.close() == []


def test_a_foreign_server_answering_health_on_the_port_fails_the_launch(tmp_path):
    """Another program binds the port (with SO_REUSEADDR, as vLLM and Python's
    http.server do) while our server loads and answers /health first: the launch fails
    naming that process — it is not the server this launch started."""
    (tmp_path / "health").write_text("ok")
    ctl = RunController(store=lambda: None)
    foreign = None
    try:
        assert ctl.launch(_sim(k=1), check_leftovers=False) == []
        sup = ctl.supervisor
        _wait(lambda: sup.server_pid is not None, 30, "our server starts")
        port = sup.config.port
        foreign = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                                   cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert not ctl.wait_ready(30)
        reason = ctl.failure_text
        assert f"port {port}: /health was answered by pid {foreign.pid} (" in reason, reason
        assert "http.server" in reason and f"not by the server this launch started (pid {sup.server_pid})" in reason
        assert ctl.close() == []
        assert _gone(sup.server_pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200 and foreign.poll() is None  # the other program is left alone
    finally:
        ctl.close()
        if foreign is not None:
            foreign.terminate()
            foreign.wait(10)


# ---------------------------------------------------------------------- item 7: the reaper's death
def test_killing_the_reaper_ends_the_server_at_once_and_the_app_says_so():
    ctl = RunController(store=lambda: None)
    try:
        assert ctl.launch(_sim(), check_leftovers=False) == []
        assert ctl.wait_ready(60), ctl.failure_text
        sup = ctl.supervisor
        server, reaper = sup.server_pid, sup.pgid
        os.kill(reaper, signal.SIGKILL)
        took = _wait(lambda: _gone(server), 5, "the server ends")
        print(f"the server ended {took:.3f} s after its reaper was SIGKILLed")
        assert took < 1.5, f"the server kept serving {took:.1f} s after its reaper died"  # was ≈ 10 s
        _wait(lambda: ctl.state == State.FAILED, EOF_GRACE_S + 2, "the app reports the failure")
        assert f"the reaper process (pid {reaper}) was killed (signal 9)" in ctl.failure_text
        assert group_members(reaper) == []
    finally:
        assert ctl.close() == []


OWNER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from app.config import ServerConfig
    from app.server.supervisor import Supervisor
    sup = Supervisor(ServerConfig(model={model!r}, max_model_len=4096), engine="sim",
                     sim_args=["--sim-gpu", "RTX 4090", "--sim-time-scale", "20"])
    sup.start()
    assert sup.wait_ready(60), sup.failure
    print(sup.pgid, sup.server_pid, flush=True)
    import time
    time.sleep(600)
""")


def test_killing_the_reaper_then_the_app_leaves_no_orphan():
    """The kill order that left a permanent orphan: the reaper first, then the app that
    would have cleaned up after it. The server learns of its reaper's death by itself."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT), model=MODEL)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pgid = server = None
    try:
        pgid, server = map(int, owner.stdout.readline().split())
        os.kill(pgid, signal.SIGKILL)  # the reaper leads the group
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        t0 = time.monotonic()
        left = wait_group_gone(pgid, 5.0)
        assert left == [] and _gone(server), f"left {[p.pid for p in left]} after {time.monotonic() - t0:.1f} s"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
        if pgid is not None and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


# ---------------------------------------------------------------------- item 8: a killed writer
WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from app.loadgen.records import RequestRecord
    from app.run.record import RunRecorder
    from app.store import RunStore
    rec = RunRecorder(RunStore(sys.argv[1]), name="killed", engine="sim", profile_data=None, clock_wall0=0.0)
    print(rec.run_id, flush=True)
    i = 0
    while True:  # one completed record received every 2 ms; its t_start is when (wall clock)
        rec.add_records([RequestRecord(level_idx=0, level=1.0, t_start=time.time(), e2e=0.0, prompt_tokens=i,
                                       output_tokens=1)])
        i += 1
        time.sleep(0.002)
""")


def test_a_sigkilled_writer_loses_at_most_the_bound_and_its_run_becomes_interrupted(tmp_path):
    """Five writers (a RunRecorder on a real store, as the app's) SIGKILLed at random
    moments: every record handed to the store more than LOSS_BOUND_S before the kill is
    there, none missing in between, and the next open marks the run interrupted."""
    rng = random.Random(15)
    lost = []
    for trial in range(5):
        db = tmp_path / f"runs{trial}.sqlite"
        w = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT)), str(db)], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
        run_id = int(w.stdout.readline())
        time.sleep(rng.uniform(0.6, 1.4))
        t_kill = time.time()
        w.kill()
        w.wait(10)
        with RunStore(db) as s:
            assert s.interrupted_runs == [run_id]
            run = s.get_run(run_id)
            reqs = s.requests(run_id)
        assert run["status"] == INTERRUPTED
        assert "ended without closing it" in run["summary"]["stop_reason"]
        seqs = sorted(q["prompt_tokens"] for q in reqs)
        assert seqs and seqs == list(range(len(seqs)))  # a prefix: nothing lost in between
        newest = max(q["t_start"] for q in reqs)
        assert run["finished"] == pytest.approx(newest)  # its last stored activity
        lost.append(t_kill - newest)
    print(f"seconds of received records lost per SIGKILL of the writer: {[round(x, 3) for x in lost]}")
    assert max(lost) <= LOSS_BOUND_S, f"seconds of records lost per kill: {[round(x, 3) for x in lost]}"


def test_a_run_whose_writer_still_runs_stays_running_and_a_reused_pid_does_not_count(tmp_path):
    db = tmp_path / "runs.sqlite"
    with RunStore(db) as mine:
        live = mine.create_run("live")  # written by this process, which is alive
        older = mine.create_run("from an older version")
        reused = mine.create_run("pid reused")
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE runs SET writer=NULL WHERE id=?", (older,))
        raw.execute("UPDATE runs SET writer=? WHERE id=?", (f"{os.getpid()}:1", reused))  # this pid, another start
    other = subprocess.run([sys.executable, "-c", "import sys; from app.store import RunStore; s = RunStore(sys.argv[1]);"
                            " print(s.interrupted_runs, s.get_run(int(sys.argv[2]))['status'])", str(db), str(live)],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert other.stdout.split("]")[-1].strip() == "running", other.stdout + other.stderr
    assert other.stdout.startswith(f"[{older}, {reused}]")
    with RunStore(db) as s:
        assert [s.get_run(i)["status"] for i in (live, older, reused)] == ["running", INTERRUPTED, INTERRUPTED]


# ---------------------------------------------------------------------- item 9: Ctrl-C during run
def test_ctrl_c_during_run_keeps_the_partial_level_and_prints_no_traceback(tmp_path):
    """A terminal's Ctrl-C reaches the app's process group; before issue 15 that held the
    load generator too, so the same SIGINT goes to it here: it must ignore it and stop on
    the app's word, delivering the level in progress, which is kept and marked partial."""
    app = AppProcess(["run", str(sim_profile(tmp_path / "p.yaml"))], tmp_path / "home")
    try:
        app.wait_line(r"^  level 2: ", 120)
        time.sleep(0.6)  # in the middle of the second level
        gen = app.wait_pid(app.loadgen)
        app.ctrl_c()
        os.kill(gen, signal.SIGINT)
        assert app.proc.wait(20) == 130
        left, _ = app.wait_gone(5)
        assert left == []
        time.sleep(0.2)
        out = app.text
        assert not CRASH_RE.search(out), out
        assert "status: aborted — aborted by the user" in out
        assert "a partial level: cut short" in out and f"4{PARTIAL_MARK}" in out, out
        with RunStore(tmp_path / "home" / "runs.sqlite") as s:
            run = s.list_runs()[0]
            levels = s.levels(run["id"])
        assert run["status"] == "aborted"
        assert [lv["stop_reason"] for lv in levels] == ["duration", "aborted"]
        assert levels[1]["n_measured"] > 0 and levels[1]["output_tps"] > 0  # its figures, from the part that ran
    finally:
        app.kill_everything()


# ---------------------------------------------------------------------- item 11: crash reasons
def _low_nofile() -> None:
    """In the app's child before exec: a hard limit of open files below vLLM's 65535, so
    that the server prints vLLM's harmless ulimit warning (as on many machines)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))


def test_a_sigkilled_server_is_reported_as_killed_not_by_the_ulimit_warning(tmp_path):
    app = AppProcess(["run", str(sim_profile(tmp_path / "p.yaml"))], tmp_path / "home", preexec=_low_nofile)
    try:
        app.wait_line(r"^  level 2: ", 120)
        server = app.wait_pid(app.server)
        os.kill(server, signal.SIGKILL)
        assert app.proc.wait(20) == 1
        assert app.wait_gone(5)[0] == []
        time.sleep(0.2)
        out = app.text
        status = next(l for l in out.splitlines() if l.startswith("status: "))
        assert status == "status: server_failed — the server was killed (signal 9 — out of memory?) after it was ready"
        assert "ulimit" not in out and "Errno 24" not in out
        diag = next(l for l in out.splitlines() if l.startswith("Diagnosis: server_killed — "))
        try:
            read_kernel_log()
        except OSError:
            assert "the kernel's log (/dev/kmsg, journalctl -k) cannot be read" in diag and "journalctl -k" in diag
        else:  # readable here (root): no OOM record names the server, so it says something else killed it
            assert "the kernel's log has no out-of-memory record of its processes (pids " in diag, diag
            assert str(server) in diag.split("(pids ")[1].split(")")[0].split(", ")
        with RunStore(tmp_path / "home" / "runs.sqlite") as s:
            run = s.list_runs()[0]
            log = [line for _, _, line in s.log_lines(run["id"])]
        assert any("Found ulimit of 1024 and failed to automatically increase" in line for line in log)  # the bait
        assert run["status"] == "server_failed"
    finally:
        app.kill_everything()


#: an out-of-memory kill as the kernel logs it (linux mm/oom_kill.c: dump_oom_summary's
#: "oom-kill:…,task=%s,pid=%d,uid=%d" and __oom_kill_process's "%s: Killed process %d (%s) …")
KERNEL_LOG = [
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,"
    "task=python3,pid=5150,uid=1000",
    "Out of memory: Killed process 5150 (python3) total-vm:9034120kB, anon-rss:3011344kB, file-rss:0kB, "
    "shmem-rss:0kB, UID:1000 pgtables:6400kB oom_score_adj:0",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/box,"
    "task_memcg=/box,task=VLLM::EngineCor,pid=4243,uid=1000",
    "Memory cgroup out of memory: Killed process 4243 (VLLM::EngineCor) total-vm:31415926kB, anon-rss:27182818kB, "
    "file-rss:1024kB, shmem-rss:0kB, UID:1000 pgtables:60000kB oom_score_adj:0",
]


def test_the_kernels_oom_record_of_the_servers_process_is_the_evidence():
    assert oom_records(KERNEL_LOG, [4242, 4243]) == KERNEL_LOG[2:]  # not pid 5150: another program
    d = killed_diagnosis(9, [4242, 4243], lambda: KERNEL_LOG, after_ready=True)
    assert d.problem == "server_killed" and d.after_ready and d.evidence == KERNEL_LOG[2:]
    assert d.explanation.startswith("the server was killed (signal 9 — out of memory?) after it was ready: yes — "
                                    "the kernel's out-of-memory killer ended it (Memory cgroup out of memory: "
                                    "Killed process 4243 (VLLM::EngineCor)")

    def unreadable() -> list[str]:
        raise OSError(errno.EPERM, "the kernel's log (/dev/kmsg, journalctl -k) cannot be read: only root may read "
                                   "it here (kernel.dmesg_restrict = 1)")

    d = killed_diagnosis(9, [4243], unreadable)
    assert "cannot be read: only root may read it here" in d.explanation
    assert "Look for 'Killed process 4243' in `journalctl -k` or `sudo dmesg`" in d.explanation and not d.evidence
    d = killed_diagnosis(15, [4243], lambda: KERNEL_LOG)
    assert d.explanation.startswith("the server was ended by signal 15 (SIGTERM), from outside vLLM Dyno")


def test_the_kernel_log_is_read_or_its_refusal_explained():
    try:
        lines = read_kernel_log()
    except OSError as e:
        assert "cannot be read" in str(e)
    else:
        assert isinstance(lines, list) and all(isinstance(x, str) for x in lines)
    with pytest.raises(OSError, match="cannot be read") if not _journal_readable() else _nothing():
        read_kernel_log("/nonexistent/kmsg")


def _journal_readable() -> bool:
    try:
        r = subprocess.run(["journalctl", "-k", "-q", "--no-pager", "-o", "cat", "-n", "1"], capture_output=True,
                           timeout=10)
        return r.returncode == 0 and bool(r.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return False


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_failures_count_against_the_slo():
    """A level where 55.7 % of the requests fail, however fast the rest: not "met". The
    SLO sets a TTFT bound only; failures are judged with DEFAULT_FAILURE_RATE then, with
    the SLO's own failure_rate when it sets one, and not at all without an SLO."""
    with ScriptedServer(Script(ttft=0.01, itl=0.002, fail_fraction=0.557)) as srv:
        spec = RampSpec(url=srv.url, levels=[2], step_seconds=1.5, prompt_tokens=8, output_tokens=4,
                        length_spread=0, max_failure_rate=1.0, slo=SLO(ttft_p99=1.0))
        res = run_ramp(spec, timeout=60)
    assert res.status == "slo_broken" and "failure_rate" in res.stop_reason, res.stop_reason
    st = res.steps[0]
    assert 0.5 < st.failure_rate < 0.6 and st.ttft_p99 < 1.0  # fast, but most failed
    assert st.slo_broken == [f"failure_rate {st.failure_rate:.1%} > {DEFAULT_FAILURE_RATE:.1%}"]
    assert not level_met(st, spec.slo) and not st.slo_met
    row = level_table([st.model_dump()]).splitlines()[1]
    assert "broken: failure_rate" in row and not row.endswith("met")
    cap = capacity_of([st], res.records, spec.slo, CapacitySearch(start=2, max_level=2))
    assert cap.users == 0 and cap.limited_by == "failures"
    assert slo_breaches(st, SLO(ttft_p99=1.0, failure_rate=0.6)) == []  # the SLO's own bound rules
    assert SLO().failure_bound is None and SLO(ttft_p99=1.0).failure_bound == DEFAULT_FAILURE_RATE
