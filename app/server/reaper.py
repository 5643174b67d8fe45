"""The reaper: a tiny parent between the app and the server (issue #2, docs/design.md "Processes").

Started by the supervisor as the leader of a new session/process group with a pipe on
its stdin. It starts the server (argv after ``--``) as its child in the same group,
with stdout/stderr inherited (the app reads them directly). Then:

- stdin line ``term`` → SIGTERM to the server's main process (graceful stop);
- stdin line ``kill`` → SIGKILL to the whole group (and to every process of the reaper's
  session that left the group: a server's child in a process group of its own);
- stdin EOF (the app exited, even by SIGKILL) → SIGTERM to the server, SIGKILL to the
  whole group 3 s later (vLLM's engine does not notice its parent dying);
- the server exits on its own → the reaper exits with the server's code, after
  SIGKILLing whatever is left of the group and of its session (orphaned
  ``VLLM::EngineCore`` etc., a Ray node's workers in groups of their own).

The reaper prints one line ``DYNO_REAPER server_pid=N`` on stderr before the server's
output starts, so the app learns the server's pid, and ``DYNO_REAPER server_signal=N``
when the server was ended by signal N (SIGKILL from the kernel's OOM killer, or from a
user): its exit code alone (128 + N) could be the server's own.

The reaper's own death (issue 15, item 7): the server is started with
``PR_SET_PDEATHSIG`` = SIGTERM (prctl(2), set in the child before it runs the server), so
a reaper killed even by SIGKILL ends the server at once — vLLM stops its engine core in
order on SIGTERM — whether or not the app is still there to finish the job (the
supervisor SIGKILLs the group after the grace when it is).

Environment (issue 15, items 1 and 5): the reaper runs in the app's own environment.
With ``--env-stdin`` the first stdin line is a JSON object ``{"env": {NAME: value}}``:
the server's extra environment (the profile's ``env:``, ``CUDA_VISIBLE_DEVICES`` …),
applied only to the child it starts — never to the reaper itself, so a loader or
interpreter variable meant for the server cannot load code into the app's helper.
The child also gets :data:`OWNER_ENV` = the reaper's process marker
(:func:`app.helper_process.process_marker`: ``<reaper pid>:<start ticks>``), inherited by
vLLM's engine core and workers; ``vllm-dyno cleanup`` reads it from
``/proc/<pid>/environ`` to tell a live session's server from a leftover
(:func:`app.helper_process.marker_alive`).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

from app.helper_process import process_marker

EOF_GRACE_S = 3.0

#: prctl(2) option: the signal the calling process gets when its parent dies
PR_SET_PDEATHSIG = 1

#: the server's environment variable that names its owning reaper: ``<pid>:<start ticks>``
OWNER_ENV = "VLLM_DYNO_OWNER"


def _read_env_header() -> dict[str, str] | None:
    """The ``--env-stdin`` header: the server's extra environment; None on EOF or bad JSON."""
    line = sys.stdin.readline()
    if not line:
        return None
    try:
        data = json.loads(line)
        env = data["env"]
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            return None
        return env
    except (ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env_stdin = False
    if "--" in argv:
        env_stdin = "--env-stdin" in argv[: argv.index("--")]
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print("reaper: no server command given", file=sys.stderr)
        return 2
    child_env = dict(os.environ)
    if env_stdin:
        extra = _read_env_header()
        if extra is None:
            print("reaper: no environment header on stdin (the app closed the pipe or sent bad JSON)",
                  file=sys.stderr, flush=True)
            return 2
        child_env.update(extra)
    child_env[OWNER_ENV] = process_marker()
    # The server must not hold our stdin (the app's lifeline pipe).
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=child_env, preexec_fn=_death_signal())
    except OSError as e:
        print(f"reaper: cannot start {argv[0]}: {e}", file=sys.stderr, flush=True)
        return 127
    print(f"DYNO_REAPER server_pid={child.pid}", file=sys.stderr, flush=True)
    pgid = os.getpgid(0)
    # Ignore SIGINT/SIGTERM aimed at the group by a terminal; the app controls us by stdin.
    # (set after the child started: an ignored disposition would be inherited by it)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def kill_group() -> None:
        # runs on the stdin thread: no signal.signal() here (main thread only). The session's
        # members that left the group first (the group's SIGKILL ends this process too)
        for pid in _group_pids(pgid):
            try:
                if pid != os.getpid() and os.getpgid(pid) != pgid:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # gone meanwhile
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def watch_stdin() -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "term":
                try:
                    child.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            elif cmd == "kill":
                kill_group()
        # EOF: the app is gone (or closed us on purpose)
        if child.poll() is None:
            try:
                child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + EOF_GRACE_S
            while time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.05)
        kill_group()

    threading.Thread(target=watch_stdin, daemon=True).start()
    rc = child.wait()
    sys.stderr.flush()
    # Leftovers of the server (engine core, workers) must not outlive it: SIGKILL every
    # other member of the group and the session, then exit with the server's code.
    others = [p for p in _group_pids(pgid) if p != os.getpid()]
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if rc < 0:  # ended by a signal: say which (the app's diagnosis tells an OOM kill from an exit)
        print(f"DYNO_REAPER server_signal={-rc}", file=sys.stderr, flush=True)
    return rc if rc >= 0 else 128 - rc


def _death_signal():
    """A ``preexec_fn`` that makes the child get SIGTERM when the reaper dies
    (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, Linux), or None where there is no prctl. The
    flag survives ``execve`` (not set-user-ID programs); a reaper that died between the
    fork and the prctl is caught by comparing the parent pid. libc is resolved here, in
    the parent: the child only calls it (no dlopen between fork and exec)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the reaper is already gone: do not start the server at all
            os._exit(1)

    return arm


def _group_pids(pgid: int) -> list[int]:
    """The processes of group ``pgid`` and of the session the reaper leads (its id is the
    same: the supervisor starts the reaper in a new session): a server's child that moved
    to a process group of its own stays in the session — Ray 2.60.0's raylet starts each
    worker in its own group (its ``process_group_cleanup_enabled``; seen on the test bed:
    ``ray::IDLE``'s group is its own pid, tests/multinode/test_multinode.py), so the workers of a
    host's Ray node (``ray start --block``, app.hosts.plan) are not in the node's group."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid or os.getsid(int(name)) == pgid:
                    pids.append(int(name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


if __name__ == "__main__":
    sys.exit(main())
