"""How the app starts its own helper processes (reaper, load generator, sim server), and
how a process is named so that its death can be told later (pid + start time).

From a normal install a helper is ``sys.executable -m MODULE``. In a frozen build
(PyInstaller: ``sys.frozen``) there is no separate Python: the executable re-enters
itself as ``EXE _helper MODULE ...`` and ``app.cli`` dispatches to the module's
``main(argv)``.

Process markers: ``<pid>:<start ticks>`` (start time in clock ticks since boot, field 22
of ``/proc/<pid>/stat``, proc(5)) name one process for good — a pid alone can be reused
by another process after the first one died. The reaper writes its marker into the
server's environment (``VLLM_DYNO_OWNER``, issue 15 item 5) and the run store records
the marker of the app writing a run (issue 15 item 8); :func:`marker_alive` tells either
whether that very process still runs.
"""
from __future__ import annotations

import os
import signal
import sys


def helper_argv(module: str) -> list[str]:
    """Argv prefix that runs ``module``'s ``main()`` in a fresh process."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "_helper", module]
    return [sys.executable, "-m", module]


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3… of ``/proc/<pid>/stat`` (after the command name); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat``
    field 22, proc(5)); None when the process is gone or there is no /proc."""
    f = _stat_fields(pid)
    try:
        return int(f[19]) if f else None
    except (IndexError, ValueError):
        return None


def process_marker(pid: int | None = None) -> str:
    """The marker ``<pid>:<start ticks>`` of process ``pid`` (default: this process);
    ``<pid>:`` where the start time cannot be read (no /proc)."""
    pid = os.getpid() if pid is None else pid
    t = start_ticks(pid)
    return f"{pid}:{'' if t is None else t}"


def marker_alive(marker: str) -> tuple[bool, int | None]:
    """``(alive, parent pid)`` for a :func:`process_marker` value: alive when process
    ``pid`` exists, is not a zombie and (where /proc tells) started at the recorded tick;
    the parent pid is None when unknown. A malformed marker is dead."""
    pid_s, _, ticks_s = marker.partition(":")
    try:
        pid = int(pid_s)
    except ValueError:
        return False, None
    if pid <= 0:
        return False, None
    f = _stat_fields(pid)
    if f is None:
        if os.path.isdir("/proc"):
            return False, None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, None
        except PermissionError:
            pass
        return True, None
    if f[0] in ("Z", "X"):
        return False, None
    if ticks_s and (len(f) < 20 or f[19] != ticks_s):
        return False, None  # the pid was reused by another process
    try:
        return True, int(f[1])
    except (IndexError, ValueError):
        return True, None


def signal_name(sig: int) -> str:
    """``SIGKILL`` for 9 and so on (``signal N`` for a number without a name)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
