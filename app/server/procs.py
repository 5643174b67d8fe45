"""Process-group helpers: who is in a group, ending it, and leftover ``VLLM::`` processes."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import psutil

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


@dataclass
class LeftoverProcess:
    """A process titled ``VLLM::…`` (orphaned engine/worker), with its GPU memory if known."""

    pid: int
    title: str
    rss_bytes: int
    gpu_bytes: int | None  # None: NVML not available


def find_leftovers(nvml: Any = None) -> list[LeftoverProcess]:
    """Processes whose title (argv[0] or name) starts with ``VLLM::``, with the GPU memory
    each holds (bytes, from NVML; ``nvml``: a pynvml-shaped double in tests)."""
    gpu = gpu_memory_by_pid(nvml)
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "memory_info"]):
        try:
            cmd = p.info["cmdline"] or []
            title = cmd[0] if cmd else ""
            name = p.info["name"] or ""
            if title.startswith("VLLM::") or name.startswith("VLLM::"):
                mi = p.info["memory_info"]
                out.append(
                    LeftoverProcess(
                        p.pid,
                        title or name,
                        mi.rss if mi else 0,
                        None if gpu is None else gpu.get(p.pid, 0),
                    )
                )
        except psutil.Error:
            continue
    return out


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
