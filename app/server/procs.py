"""Process-group helpers: who is in a group, ending it, and leftover vLLM processes
(whose owner — the reaper that started them — is gone; issue 15, item 5)."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import psutil

from app.server.reaper import OWNER_ENV, owner_alive
from app.telemetry.nvml import gpu_memory_by_pid


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group id is ``pgid``."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return out


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the whole group; a group that is already gone is fine."""
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
    alive, app_pid = owner_alive(marker)
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
