"""Process-group helpers: who is in a group, ending it, and leftover vLLM processes
(whose owner — the reaper that started them — is gone; issue 15, item 5)."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import psutil

from app.helper_process import marker_alive
from app.server.reaper import OWNER_ENV
from app.telemetry.nvml import gpu_memory_by_pid


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group id is ``pgid``, or whose session id
    is: the supervisor starts the reaper as the leader of a new session and group (one id),
    and a server's child that moved to a group of its own stays in the session (Ray 2.60's
    workers under a host's ``ray start``, app.server.reaper)."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if pgid in (os.getpgid(p.pid), os.getsid(p.pid)) and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return out


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the whole group and to the members of its session that left it
    (:func:`group_members`); a group that is already gone is fine."""
    for p in group_members(pgid):
        try:
            if os.getpgid(p.pid) != pgid:
                os.kill(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group_gone(pgid: int, timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for the group to empty; return whatever is left."""
    deadline = time.monotonic() + timeout
    left = group_members(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = group_members(pgid)
    return left


#: what :func:`find_leftovers` makes of a vLLM process (see LeftoverProcess.kind)
ORPHANED, OWNED, UNMANAGED = "orphaned", "owned", "unmanaged"


@dataclass
class LeftoverProcess:
    """A vLLM process (API server, ``VLLM::EngineCore``/``Worker``, or a server vLLM Dyno
    started) with its memory: ``rss_bytes``; ``gpu_bytes`` from NVML (None: NVML not
    available).

    ``kind`` (issue 15, item 5): ``orphaned`` — vLLM Dyno started it and its owning
    reaper is gone: a leftover, ended by ``cleanup --yes``; ``owned`` — a running vLLM
    Dyno owns it (``owner_pid``: that app, or its reaper when the app is unknown): never
    ended; ``unmanaged`` — not started by vLLM Dyno (no owner marker, or another user's
    process): ended only on explicit request (``--include-unmanaged``). ``create_time``
    (psutil, s since the epoch) guards against a reused pid when ending."""

    pid: int
    title: str
    rss_bytes: int
    gpu_bytes: int | None  # None: NVML not available
    kind: str = UNMANAGED
    owner_pid: int | None = None
    create_time: float = 0.0

    @property
    def endable(self) -> bool:
        """True for a leftover that ``cleanup --yes`` ends (``orphaned``)."""
        return self.kind == ORPHANED

    def describe(self) -> str:
        """One line for humans: whose it is."""
        if self.kind == OWNED:
            return f"owned by a running vLLM Dyno (pid {self.owner_pid})"
        if self.kind == ORPHANED:
            return "leftover: the vLLM Dyno that started it is gone"
        return "not started by vLLM Dyno"


def _is_vllm(cmd: list[str], name: str) -> bool:
    """A vLLM process by its title (``VLLM::…``, set by vLLM's engine core and workers)
    or its command line (``-m vllm.entrypoints…``, the ``vllm serve`` script)."""
    title = cmd[0] if cmd else ""
    if title.startswith("VLLM::") or name.startswith("VLLM::"):
        return True
    if any(a.startswith("vllm.entrypoints") for a in cmd[:4]):
        return True
    return any(os.path.basename(a) == "vllm" and cmd[i + 1:i + 2] == ["serve"] for i, a in enumerate(cmd[:3]))


def _owner_of(p: psutil.Process) -> str | None:
    """The :data:`~app.server.reaper.OWNER_ENV` marker of ``p`` (None: none, or unreadable)."""
    try:
        return p.environ().get(OWNER_ENV)
    except (psutil.Error, OSError):
        return None


def classify(p: psutil.Process) -> tuple[str, int | None] | None:
    """``(kind, owner pid)`` of a process (see :class:`LeftoverProcess`), or None when it
    is neither a vLLM process nor a server vLLM Dyno started."""
    try:
        cmd = p.cmdline() or []
        name = p.name() or ""
    except (psutil.Error, OSError):
        return None
    marker = _owner_of(p)
    if marker is None:
        return (UNMANAGED, None) if _is_vllm(cmd, name) else None
    alive, app_pid = marker_alive(marker)
    if alive:
        return OWNED, app_pid if app_pid not in (None, 1) else int(marker.partition(":")[0])
    return ORPHANED, None


def find_leftovers(nvml: Any = None) -> list[LeftoverProcess]:
    """Every vLLM process of this machine and every server vLLM Dyno started, classified
    by owner (:class:`LeftoverProcess`.kind), with the GPU memory each holds (bytes, from
    NVML; ``nvml``: a pynvml-shaped double in tests). This process is never listed."""
    gpu = gpu_memory_by_pid(nvml)
    out = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "name", "cmdline", "memory_info", "create_time", "status"]):
        try:
            if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            got = classify(p)
            if got is None:
                continue
            cmd = p.info["cmdline"] or []
            title = cmd[0] if cmd and cmd[0].startswith("VLLM::") else " ".join(cmd[:4])[:120]
            mi = p.info["memory_info"]
            out.append(LeftoverProcess(p.pid, title or p.info["name"] or "", mi.rss if mi else 0,
                                       None if gpu is None else gpu.get(p.pid, 0), got[0], got[1],
                                       p.info["create_time"] or 0.0))
        except psutil.Error:
            continue
    return out


def end_leftovers(left: list[LeftoverProcess], *, include_unmanaged: bool = False,
                  grace: float = 3.0) -> list[int]:
    """End the ``orphaned`` processes of ``left`` (and the ``unmanaged`` ones with
    ``include_unmanaged``); an ``owned`` one never. Each is checked again right before:
    same process (create time) and still of an endable kind — a server whose owner came
    back, or a reused pid, is left alone. SIGTERM, ``grace`` s, SIGKILL; returns the pids
    still alive after."""
    kinds = {ORPHANED, UNMANAGED} if include_unmanaged else {ORPHANED}
    pids = []
    for lp in left:
        if lp.kind not in kinds:
            continue
        try:
            p = psutil.Process(lp.pid)
            if lp.create_time and abs(p.create_time() - lp.create_time) > 0.01:
                continue
            now = classify(p)
        except psutil.Error:
            continue
        if now is not None and now[0] in kinds:
            pids.append(lp.pid)
    return end_processes(pids, grace)


def end_processes(pids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM, wait ``grace`` s, SIGKILL what is left; return pids still alive after."""
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.terminate()
            procs.append(p)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=2)
    return [p.pid for p in alive]


# ---------------------------------------------------------------------- ports (issue 15, item 6)
def port_listeners(port: int) -> list[int | None]:
    """The pids of the processes listening on TCP ``port`` (any address, IPv4 or IPv6);
    None for a socket whose process cannot be seen (another user's)."""
    try:
        conns = psutil.net_connections("inet")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port},
                  key=lambda p: -1 if p is None else p)


def describe_process(pid: int) -> str:
    """``pid N (command line, shortened)`` for messages; ``pid N`` when it cannot be read."""
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:117] + '…' if len(cmd) > 120 else cmd})" if cmd else f"pid {pid}"


def _starts_with_port(cmd: list[str], port: int) -> bool:
    """``--port N`` (or ``--port=N``) among a command's own options — not after ``--``,
    where a wrapper such as the reaper holds the command it runs."""
    p = str(port)
    own = cmd[:cmd.index("--")] if "--" in cmd else cmd
    return any(a == "--port" and own[i + 1:i + 2] == [p] or a == f"--port={p}" for i, a in enumerate(own))


def port_holder(port: int) -> str:
    """Who holds TCP ``port``, for a message: the listening process (pid and command);
    else a process started with ``--port N`` (vLLM binds its port before it loads the
    model and listens only when ready, and such a socket is not listed by the kernel);
    else a socket of another user's process, or one vLLM Dyno cannot identify."""
    listeners = port_listeners(port)
    seen = [p for p in listeners if p is not None]
    if seen:
        return " and ".join(describe_process(p) for p in seen)
    me = os.getpid()
    starting = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != me and _starts_with_port(p.info["cmdline"] or [], port):
                starting.append(p.pid)
        except psutil.Error:
            continue
    if starting:
        return " and ".join(describe_process(p) for p in starting) + ", a server that has not started listening yet"
    if listeners:
        return "a process of another user (its pid is not visible)"
    return "a process vLLM Dyno cannot identify (a socket bound without listening, e.g. a server still loading)"


def group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process of group ``pgid`` listens on TCP ``port``: True/False, None when
    nobody visible listens on it (cannot tell)."""
    listeners = port_listeners(port)
    if not listeners:
        return None
    for pid in listeners:
        if pid is None:
            continue
        try:
            if os.getpgid(pid) == pgid:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False
