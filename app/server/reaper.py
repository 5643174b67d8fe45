"""The reaper: a tiny parent between the app and the server (issue #2, docs/design.md "Processes").

Started by the supervisor as the leader of a new session/process group with a pipe on
its stdin. It starts the server (argv after ``--``) as its child in the same group,
with stdout/stderr inherited (the app reads them directly). Then:

- stdin line ``term`` → SIGTERM to the server's main process (graceful stop);
- stdin line ``kill`` → SIGKILL to the whole group;
- stdin EOF (the app exited, even by SIGKILL) → SIGTERM to the server, SIGKILL to the
  whole group 3 s later (vLLM's engine does not notice its parent dying);
- the server exits on its own → the reaper exits with the server's code, after
  SIGKILLing whatever is left of the group (orphaned ``VLLM::EngineCore`` etc.).

The reaper prints one line ``DYNO_REAPER server_pid=N`` on stderr before the server's
output starts, so the app learns the server's pid.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

EOF_GRACE_S = 3.0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print("reaper: no server command given", file=sys.stderr)
        return 2
    # The server must not hold our stdin (the app's lifeline pipe).
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
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
        # runs on the stdin thread: no signal.signal() here (main thread only)
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
    # other member of the group, then exit with the server's code.
    others = [p for p in _group_pids(pgid) if p != os.getpid()]
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return rc if rc >= 0 else 128 - rc


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getpgid(int(name)) == pgid:
                    pids.append(int(name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


if __name__ == "__main__":
    sys.exit(main())
