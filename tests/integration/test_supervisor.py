"""Supervisor bad-input paths and the reaper, without vLLM (the e2e file has the real launches)."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from app.config import ServerConfig
from app.helper_process import helper_argv
from app.server.launch import LaunchError
from app.server.procs import group_members, wait_group_gone
from app.server.supervisor import ServerState, Supervisor


def test_missing_model_path_fails_before_launch(tmp_path):
    sup = Supervisor(ServerConfig(model=str(tmp_path / "nope")), python=sys.executable)
    with pytest.raises(LaunchError, match=str(tmp_path / "nope")):
        sup.start()
    assert sup.pgid is None and sup._proc is None


def test_interpreter_without_vllm(tiny_model):
    sup = Supervisor(ServerConfig(model=str(tiny_model)), python=sys.executable)
    with pytest.raises(LaunchError, match="no vLLM installed"):
        sup.start()
    assert sup._proc is None


def test_interpreter_that_does_not_exist(tiny_model, tmp_path):
    with pytest.raises(LaunchError, match="does not exist"):
        Supervisor(ServerConfig(model=str(tiny_model)), python=str(tmp_path / "python9")).start()


def test_port_in_use_is_named(tiny_model, vllm_python):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sup = Supervisor(ServerConfig(model=str(tiny_model), port=port), python=vllm_python)
        with pytest.raises(LaunchError, match=f"port {port}"):
            sup.start()
        assert sup._proc is None


def _reaper_with_stubborn_tree(tmp_path):
    """A 'server' that starts a grandchild ignoring SIGTERM (like an orphaned EngineCore)."""
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent("""
        import signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child up', flush=True); time.sleep(600)"])
        print("server up", flush=True)
        time.sleep(600)
    """))
    p = subprocess.Popen(helper_argv("app.server.reaper") + ["--", sys.executable, str(script)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    assert p.stdout.readline().strip() == b"server up"
    assert p.stdout.readline().strip() == b"child up"
    assert len(group_members(p.pid)) == 3
    return p


def test_reaper_ends_group_when_app_pipe_closes(tmp_path):
    p = _reaper_with_stubborn_tree(tmp_path)
    t0 = time.monotonic()
    p.stdin.close()  # what the kernel does when the app dies, even by SIGKILL
    left = wait_group_gone(p.pid, 6.0)
    assert left == [] and time.monotonic() - t0 < 5.0
    p.wait(5)


def test_reaper_exits_with_server_code_and_kills_leftovers(tmp_path):
    script = tmp_path / "server.py"
    script.write_text("import subprocess, sys\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      "print('bye', flush=True); sys.exit(3)\n")
    p = subprocess.Popen(helper_argv("app.server.reaper") + ["--", sys.executable, str(script)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    assert p.wait(20) == 3
    assert wait_group_gone(p.pid, 5.0) == []


@pytest.mark.parametrize("how", ["pipe closed", "server exits", "app kills the group"])
def test_reaper_ends_a_child_that_left_the_group_but_not_the_session(tmp_path, how):
    """A server's child in a process group of its own (as Ray 2.60.0's raylet starts each
    worker: ``ray::IDLE``'s group is its own pid, tests/multinode/test_multinode.py) but still in the
    reaper's session, ignoring SIGTERM: the reaper ends it when the app's pipe closes and
    when the server exits, and the supervisor's SIGKILL after the grace
    (app.server.procs.kill_group) too; it counts as a member of the server's group."""
    from app.server.procs import kill_group

    import psutil

    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import os, signal, time; os.setpgid(0, 0); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(os.getpid(), flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
        print(child.stdout.readline().decode().strip(), flush=True)
        if {how == "server exits"!r}:  # once the test has seen the worker in the group
            while not os.path.exists({str(tmp_path / "go")!r}):
                time.sleep(0.02)
            sys.exit(0)
        time.sleep(600)
    """))
    p = subprocess.Popen(helper_argv("app.server.reaper") + ["--", sys.executable, str(script)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        worker = int(p.stdout.readline().strip())
        assert os.getpgid(worker) == worker != p.pid and os.getsid(worker) == p.pid  # own group, the session
        assert worker in [m.pid for m in group_members(p.pid)]
        (tmp_path / "go").touch()
        if how == "pipe closed":
            p.stdin.close()  # the app (or a host's agent) gone
        elif how == "app kills the group":
            kill_group(p.pid)
        p.wait(20)
        t = time.monotonic()
        while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() - t < 10:
            time.sleep(0.05)
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except (OSError, UnboundLocalError):
            pass
        if p.poll() is None:
            p.kill()
