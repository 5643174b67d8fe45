"""``vllm-dyno`` as a subprocess, for tests that kill it or its helpers (issue 15 items
7–9 and the kill-order matrix).

:class:`AppProcess` starts ``python -m app.cli …`` (as tests/e2e/test_supervisor_e2e.py
does) with its own ``VLLM_DYNO_HOME``, in its own session (a terminal's Ctrl-C is then
``os.killpg(app.pid, SIGINT)``), and reads its output on a thread with the time each line
arrived. Its helpers are found in the process tree: the reaper (the app's child running
``app.server.reaper``), the server (the reaper's child) and the load generator (the app's
child running ``app.loadgen.worker``). Every process of one app — whoever its parent is
by now — carries the app's ``VLLM_DYNO_HOME`` in its environment, which
:meth:`AppProcess.leftovers` looks for: that finds an orphan that left the tree, and
never another test's process.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.conftest import ROOT

#: what a traceback or a crash of the app or a helper prints
CRASH_RE = re.compile(r"Traceback \(most recent call last\)|Fatal Python error|KeyboardInterrupt")


def sim_profile(path: Path, *, time_scale: float = 10, levels: str = "[2, 4, 4]", step_seconds: float = 20,
                model: str = "meta-llama/Llama-3.1-8B-Instruct", slo: str | None = None) -> Path:
    """A sim profile (one RTX 4090) whose load takes ≈ 3 s of wall time at ``time_scale`` 10
    and whose levels take ``step_seconds`` ÷ ``time_scale`` each."""
    path.write_text(
        "schema_version: 1\nname: faults\nengine: sim\n"
        f"sim: {{gpu: RTX 4090, count: 1, time_scale: {time_scale}, seed: 1}}\n"
        f"server: {{model: {model}, served-model-name: m, max-num-seqs: 16, max-model-len: 4096}}\n"
        f"ramp: {{levels: {levels}, step_seconds: {step_seconds}, prompt_tokens: 64, output_tokens: 16"
        + (f", slo: {slo}" if slo else "") + "}\n"
        "hardware: {gpu: RTX 4090, count: 1}\n")
    return path


class AppProcess:
    """``python -m app.cli ARGS`` with ``VLLM_DYNO_HOME=home`` (stdout and stderr merged).
    ``lines``: ``(time.monotonic(), text)``; ``preexec``: run in the child before exec
    (e.g. a lower open-files limit)."""

    def __init__(self, args: list[str], home: Path, *, env: dict[str, str] | None = None, preexec=None) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        e = dict(os.environ, VLLM_DYNO_HOME=str(self.home), PYTHONUNBUFFERED="1")
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "app.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, env=e,
                                     start_new_session=True, preexec_fn=preexec)
        self.pid = self.proc.pid
        self.lines: list[tuple[float, str]] = []
        self._cv = threading.Condition()
        self._known: set[int] = {self.pid}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            with self._cv:
                self.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip("\n")))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    @property
    def text(self) -> str:
        with self._cv:
            return "\n".join(t for _, t in self.lines)

    def wait_line(self, pattern: str, timeout: float = 60.0) -> float:
        """Wait for an output line matching ``pattern`` (a regex); returns the time it arrived.
        Raises AssertionError with the output on timeout or when the app exits first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for t, line in self.lines:
                    if rx.search(line):
                        return t
                if self.proc.poll() is not None and not any(rx.search(l) for _, l in self.lines):
                    self._cv.wait(0.2)  # the last lines may still be on their way
                    if not any(rx.search(l) for _, l in self.lines):
                        raise AssertionError(f"the app exited ({self.proc.returncode}) before {pattern!r}:\n"
                                             + "\n".join(l for _, l in self.lines[-40:]))
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line {pattern!r} within {timeout:g} s:\n"
                                         + "\n".join(l for _, l in self.lines[-40:]))
                self._cv.wait(min(left, 0.2))

    # ---- the process tree -------------------------------------------------------------
    def _children(self, pid: int) -> list[psutil.Process]:
        try:
            return psutil.Process(pid).children()
        except psutil.Error:
            return []

    def _child_running(self, parent: int | None, module: str) -> int | None:
        if parent is None:
            return None
        for c in self._children(parent):
            try:
                if module in " ".join(c.cmdline()):
                    self._known.add(c.pid)
                    return c.pid
            except psutil.Error:
                continue
        return None

    def reaper(self) -> int | None:
        return self._child_running(self.pid, "app.server.reaper")

    def server(self) -> int | None:
        r = self.reaper()
        kids = self._children(r) if r is not None else []
        if kids:
            self._known.add(kids[0].pid)
            return kids[0].pid
        return None

    def loadgen(self) -> int | None:
        return self._child_running(self.pid, "app.loadgen.worker")

    def wait_pid(self, find, timeout: float = 30.0) -> int:
        """Poll ``find()`` (e.g. :meth:`server`) until it returns a pid."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = find()
            if pid is not None:
                return pid
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"no {getattr(find, '__name__', 'process')} process appeared:\n{self.text[-3000:]}")

    def leftovers(self) -> list[psutil.Process]:
        """Live (non-zombie) processes of this app: its helpers and servers wherever they
        are now (found by ``VLLM_DYNO_HOME`` in their environment) and every pid seen."""
        me, home, out = os.getpid(), str(self.home), {}
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if p.pid in self._known or p.environ().get("VLLM_DYNO_HOME") == home:
                    out[p.pid] = p
            except psutil.Error:
                continue
        return list(out.values())

    def wait_gone(self, timeout: float) -> tuple[list[psutil.Process], float]:
        """Wait up to ``timeout`` s until no process of this app is left (the app itself is
        reaped as it exits); returns (what is left, seconds it took)."""
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is None:
                left = self.leftovers()
            else:
                left = [p for p in self.leftovers() if p.pid != self.pid]
            if not left or time.monotonic() - t0 >= timeout:
                return left, time.monotonic() - t0
            time.sleep(0.05)

    def kill_everything(self) -> None:
        """Clean-up after a failed test: SIGKILL whatever is left."""
        for p in self.leftovers():
            try:
                p.kill()
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def signal(self, pid: int, sig: int) -> float:
        """Send ``sig`` to ``pid``; returns the wall time (``time.time()``) just before."""
        t = time.time()
        os.kill(pid, sig)
        return t

    def ctrl_c(self) -> float:
        """What a terminal's Ctrl-C does: SIGINT to the app's whole process group."""
        t = time.time()
        os.killpg(self.pid, signal.SIGINT)
        return t
