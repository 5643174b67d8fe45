"""Supervisor: start a server in its own process group, follow its states, stop it.

States (timestamps on the session clock): starting → loading → ready → stopping →
stopped, or failed (reason + last 50 log lines). Failed after ready too: vLLM's engine
can die on the first request after ``/health`` said 200; the API server then exits
(vllm/entrypoints/launcher.py ``terminate_if_errored``, within its 5 s watchdog; exit
code 0 in 0.32), or, with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``, stays up and answers
``/health`` with 503 (vllm/entrypoints/serve/instrumentator/health.py). Both are
failures (:attr:`Supervisor.was_ready` tells the diagnosis). The server is started through
:mod:`app.server.reaper` so that it dies with the app even if the app is SIGKILLed.
Stop = SIGTERM to the server's main process, a grace period (default 20 s), SIGKILL
to the group, then a psutil check that no process of the group is left
(docs/vllm-facts.md, "Shutdown").

Issue 15: the port is held (:class:`app.server.launch.PortReservation`) from the launch
until the server is ready, and ready means ``/health`` 200 answered by a process of the
server's own group (the listening socket's owner, psutil) — another process answering
fails the launch, naming it (item 6). A reaper that dies (killed) took the server with it
(the server's ``PR_SET_PDEATHSIG``); what is left of the group is SIGKILLed after the
reaper's grace, before the log readers are waited for, and the failure says the reaper
was killed (item 7). A server ended by a signal is reported as such (the reaper's
``server_signal`` line: SIGKILL → "killed (signal 9 — out of memory?)"), and a WARNING
line of its log is never taken for the cause of an exit (item 11).

A headless part of a multi-node server (``--headless`` in its options, or engine ``ray``:
a host's ``ray start --block`` node, issue 21) runs no API server: it holds no port, its readiness is the head's (the head answers ``/health``
only once every node's engines or workers joined it), so it stays ``loading`` until it
is stopped or exits — an exit is a failure — and the startup timeout is the head's.
"""
from __future__ import annotations

import collections
import enum
import json
import logging
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

from app.clock import SessionClock
from app.config import ServerConfig
from app.engines import Engine
from app.helper_process import helper_argv, signal_name
from app.server import procs
from app.server.launch import LaunchError, PortReservation, prepare
from app.server.logparse import LogParser, strip_ansi
from app.server.reaper import EOF_GRACE_S

#: how a failure of a server process that ended by itself (or stopped answering) opens
#: (:meth:`Supervisor._exit_reason`, the dead /health check): the cause, if any, is in its
#: log — a failure with another wording (a bad input, a lost host, a signal from another
#: process, the reaper killed) names its cause itself
EXIT_REASONS = ("the server exited with code", "the server was ready, then", "the server was killed")

log = logging.getLogger(__name__)

_REAPER_RE = re.compile(r"^DYNO_REAPER server_(pid|signal)=(\d+)")
#: a vLLM WARNING line (``WARNING 01-02 12:00:00 [file.py:1] …``, maybe after ``(APIServer pid=N) ``):
#: never the cause of an exit (vLLM's ulimit warning quotes ``OSError: [Errno 24]``)
_WARNING_RE = re.compile(r"^(?:\(\S+ pid=\d+\) )?WARNING\b")
#: seconds between snapshots of the server group's pids (:attr:`Supervisor.member_pids`)
MEMBERS_INTERVAL_S = 2.0
_ERROR_RE = re.compile(
    r"(error:|Error:|Error\b|Exception:|unrecognized arguments|Unknown quantization|No available memory|out of memory)",
)
#: uvicorn's access log line (``"POST /v1/completions HTTP/1.1" 500 Internal Server Error``): not a cause
_ACCESS_RE = re.compile(r'"[A-Z]+ \S+ HTTP/[\d.]+" \d{3}')


def health_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of ``GET url/health`` (200 healthy; vLLM answers 503 once its engine
    is dead), None when the server does not answer (refused, timed out)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


class ServerState(str, enum.Enum):
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass
class StateChange:
    """One transition: ``t`` is seconds on the session clock; ``reason`` for failures."""

    state: ServerState
    t: float
    reason: str = ""
    log_tail: list[str] = field(default_factory=list)


class Supervisor:
    """Owns one server process group.

    ``config``: the ServerConfig (port chosen at launch when unset). ``engine``: an
    :class:`app.engines.Engine` (or its name) that launches a process: ``vllm``, ``sim``
    or ``ray``. ``python``: the vLLM interpreter (see interpreter.resolve_python).
    ``startup_timeout`` and ``grace`` in seconds; ``ready_health_interval``: seconds between
    ``/health`` checks once ready (a 5xx answer = the engine died; no answer is not taken
    as death while the process lives: a loaded server can be slow to answer). Subscribers are plain callables called
    on the supervisor's threads: ``on_line(stream, text, t)`` and ``on_state(StateChange)``.
    :meth:`start` raises :class:`LaunchError` for bad input before starting anything.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        engine: Engine | str = Engine.VLLM,
        python: str | None = None,
        sim_args: list[str] | None = None,
        startup_timeout: float = 900.0,
        grace: float = 20.0,
        health_interval: float = 0.5,
        ready_health_interval: float = 5.0,
        clock: SessionClock | None = None,
        log_capacity: int = 20000,
    ) -> None:
        self.config = config
        #: an :class:`app.engines.Engine` (a name that is none stays as given: :meth:`start` refuses it)
        self.engine: Engine | str = Engine.parse(engine) or engine
        self.python = python
        self.sim_args = list(sim_args or [])
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.health_interval = health_interval
        self.ready_health_interval = ready_health_interval
        self.dead_health: int | None = None  # the 5xx /health answered after ready
        self.clock = clock or SessionClock()
        self.lines: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=log_capacity)
        self.parser = LogParser()
        #: session-clock seconds at :meth:`start` (the launch's phases are timed from it)
        self.started_t: float | None = None
        self.history: list[StateChange] = []
        self.interpreter = None
        self.argv: list[str] = []
        self.server_pid: int | None = None
        self.pgid: int | None = None
        self.returncode: int | None = None
        #: the signal that ended the server's main process (the reaper reports it), e.g. 9
        self.server_signal: int | None = None
        #: the signal that killed the reaper itself (the server is then ended with it)
        self.reaper_signal: int | None = None
        #: every pid seen in the server's group (to find the kernel's OOM record of one)
        self.member_pids: set[int] = set()
        self.leftovers: list[int] = []
        self._reservation: PortReservation | None = None
        self._line_subs: list[Callable[[str, str, float], None]] = []
        self._state_subs: list[Callable[[StateChange], None]] = []
        self._proc: subprocess.Popen | None = None
        self._lock = threading.RLock()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._stopping = False
        self._last_output = time.monotonic()
        self._threads: list[threading.Thread] = []
        self.state = ServerState.STOPPED

    # ------------------------------------------------------------------ subscription
    def on_line(self, cb: Callable[[str, str, float], None]) -> None:
        self._line_subs.append(cb)

    def on_state(self, cb: Callable[[StateChange], None]) -> None:
        self._state_subs.append(cb)

    # ------------------------------------------------------------------ properties
    @property
    def url(self) -> str:
        """Where the app reaches the server: loopback for a wildcard bind (``0.0.0.0``
        → 127.0.0.1, ``::`` → [::1]), an IPv6 address in brackets."""
        host = self.config.host or "0.0.0.0"
        if host == "0.0.0.0":
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.config.port}"

    @property
    def headless(self) -> bool:
        """A headless part of a multi-node server (no API server, no port of its own): a
        ``--headless`` vLLM part, or a Ray node (engine ``ray``)."""
        return (isinstance(self.engine, Engine) and self.engine.spec.headless) or "--headless" in self.config.extra_args

    @property
    def failure(self) -> StateChange | None:
        for ch in reversed(self.history):
            if ch.state == ServerState.FAILED:
                return ch
        return None

    @property
    def was_ready(self) -> bool:
        """True once the server has been ready — ``/health`` 200, or uvicorn's
        ``Application startup complete.`` (a request can reach it, and kill the engine,
        before this supervisor's next ``/health`` check) — even after it failed."""
        return self._ready.is_set() or self.parser.facts.ready

    @property
    def exited(self) -> bool:
        """True once the server's process (the reaper and the server under it) has ended."""
        return self._proc is not None and self._proc.poll() is not None

    def silent_for(self) -> float:
        """Seconds since the server last printed anything (for the NCCL-hang diagnosis)."""
        return time.monotonic() - self._last_output

    def launch_phases(self) -> dict[str, float]:
        """Each launch phase reached so far (:data:`app.server.logparse.LAUNCH_PHASES`)
        → its start, seconds after :meth:`start`."""
        if self.started_t is None:
            return {}
        return {k: max(0.0, t - self.started_t) for k, t in dict(self.parser.facts.phase_times).items()}

    def log_tail(self, n: int = 50) -> list[str]:
        with self._lock:
            return [l for _, _, l in list(self.lines)[-n:]]

    # ------------------------------------------------------------------ transitions
    def _set_state(self, state: ServerState, reason: str = "") -> None:
        with self._lock:
            if self.state == state:
                return
            if self.state == ServerState.FAILED and state in (ServerState.STOPPING, ServerState.STOPPED):
                return  # a failure stays the final word (the stop that follows it too)
            self.state = state
            ch = StateChange(state, self.clock.now(), reason, self.log_tail(50) if state == ServerState.FAILED else [])
            self.history.append(ch)
        if state == ServerState.READY:
            self._ready.set()
        for cb in list(self._state_subs):
            try:
                cb(ch)
            except Exception:  # a subscriber must not kill the supervisor
                log.exception("state subscriber failed")

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Validate, then start the reaper + server. Raises LaunchError on bad input."""
        if self._proc is not None:
            raise LaunchError("this supervisor already started a server; create a new one")
        self.config, argv, env, self.interpreter, self._reservation = prepare(
            self.config, self.engine, self.python, self.sim_args)
        self.argv = argv
        self.started_t = self.clock.now()
        self._set_state(ServerState.STARTING)
        try:
            # the reaper runs in the app's environment; the server's extra environment
            # travels as data on its stdin and is applied to the server only (issue 15)
            self._proc = subprocess.Popen(
                helper_argv("app.server.reaper") + ["--env-stdin", "--"] + argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                bufsize=0,
            )
            self._proc.stdin.write(json.dumps({"env": env}).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError as e:
            self._release_port()
            self._set_state(ServerState.FAILED, f"could not start the server: {e}")
            raise LaunchError(f"could not start the server: {e}") from e
        self.pgid = self._proc.pid  # session leader → its pid is the group id
        if self.headless:
            self._release_port()  # it serves nothing: the port chosen for it stays unused
        self._last_output = time.monotonic()
        for name, stream in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
            t = threading.Thread(target=self._reader, args=(name, stream), daemon=True, name=f"dyno-{name}")
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._monitor, daemon=True, name="dyno-monitor")
        t.start()
        self._threads.append(t)

    def _reader(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            text = strip_ansi(raw.decode("utf-8", "replace"))
            t = self.clock.now()
            self._last_output = time.monotonic()
            if name == "stderr":
                m = _REAPER_RE.match(text)
                if m:
                    if m.group(1) == "pid" and self.server_pid is None:
                        self.server_pid = int(m.group(2))
                        self.member_pids.add(self.server_pid)
                    elif m.group(1) == "signal":
                        self.server_signal = int(m.group(2))
                    continue
            with self._lock:
                self.lines.append((t, name, text))
            if self.state == ServerState.STARTING:
                self._set_state(ServerState.LOADING)
            kinds = self.parser.feed(text, t)
            if "ready" in kinds:
                self._health_now = True
            for cb in list(self._line_subs):
                try:
                    cb(name, text, t)
                except Exception:
                    log.exception("line subscriber failed")
        stream.close()

    def _health_ok(self) -> bool:
        return health_status(self.url) == 200

    def _release_port(self) -> None:
        r, self._reservation = self._reservation, None
        if r is not None:
            r.close()

    def _port_taken_by_another(self) -> str | None:
        """``/health`` answered 200 while starting: is the process listening on the port
        ours (a member of the server's group)? The failure reason when another process
        answered (issue 15, item 6), else None — also when no listener can be seen."""
        assert self.pgid is not None and self.config.port is not None
        if procs.group_listens_on(self.pgid, self.config.port) is not False:
            return None
        port = self.config.port
        return (f"port {port}: /health was answered by {procs.port_holder(port)}, not by the server this launch "
                f"started (pid {self.server_pid}): another server listens on port {port}. Stop it, or choose "
                "another --port (leave it unset to let vLLM Dyno pick a free one)")

    def _snapshot_members(self) -> None:
        if self.pgid is not None:
            self.member_pids.update(p.pid for p in procs.group_members(self.pgid))

    def _engine_died(self) -> bool:
        """Monitor thread, once ready: True when ``/health`` answers 5xx (the engine is
        dead) and the server did not exit by itself within 3 s (vLLM's keep-alive mode);
        the failure is then set and the server stopped. A server that exits is left to
        the exit path (its whole log read first)."""
        code = health_status(self.url)
        if code is None or code < 500:
            return False
        self.dead_health = code
        assert self._proc is not None
        try:
            self._proc.wait(timeout=3.0)
            return False  # it went by itself: the exit path reports it
        except subprocess.TimeoutExpired:
            pass
        quiet = time.monotonic() + 3.0  # the engine's traceback may still be arriving
        while self.silent_for() < 0.5 and time.monotonic() < quiet:
            time.sleep(0.1)
        self._set_state(ServerState.FAILED, f"the server was ready, then /health answered {code}: its engine "
                                            f"died and the server can serve no more")
        threading.Thread(target=self.stop, daemon=True).start()
        return True

    def _monitor(self) -> None:
        assert self._proc is not None
        t_start = time.monotonic()
        next_health = next_members = 0.0
        self._health_now = False
        while True:
            rc = self._proc.poll()
            if rc is not None:
                break
            if time.monotonic() >= next_members:
                next_members = time.monotonic() + MEMBERS_INTERVAL_S
                self._snapshot_members()
            if self.state in (ServerState.STARTING, ServerState.LOADING) and self.headless:
                pass  # no API server: ready is the head's; an exit is caught above
            elif self.state in (ServerState.STARTING, ServerState.LOADING):
                if self._health_ok():
                    taken = self._port_taken_by_another()
                    if taken:
                        self._set_state(ServerState.FAILED, taken)
                        threading.Thread(target=self.stop, daemon=True).start()
                        continue
                    self._release_port()  # ours listens on it now
                    self._set_state(ServerState.READY)
                elif time.monotonic() - t_start > self.startup_timeout:
                    self._set_state(
                        ServerState.FAILED,
                        f"the server did not become ready within {self.startup_timeout:.0f} s "
                        f"(startup timeout); last output {self.silent_for():.0f} s ago",
                    )
                    threading.Thread(target=self.stop, daemon=True).start()
            elif self.state == ServerState.READY and not self._stopping and time.monotonic() >= next_health:
                next_health = time.monotonic() + self.ready_health_interval
                if self._engine_died():
                    continue  # the stop ends the process; the loop then sees it exit
            if self._health_now:
                self._health_now = False
                continue
            time.sleep(self.health_interval if self.state != ServerState.READY else 0.5)
        self._release_port()
        if rc < 0 and self.pgid is not None:
            # the reaper itself was killed (its own exits are codes ≥ 0): the server got SIGTERM
            # from the kernel (PR_SET_PDEATHSIG, app.server.reaper); what is left of its group
            # gets the reaper's grace, then SIGKILL — before waiting for the log readers, which
            # see the end of the output only once the server is gone (issue 15, item 7)
            self.reaper_signal = -rc
            if procs.wait_group_gone(self.pgid, EOF_GRACE_S):
                procs.kill_group(self.pgid)
        for t in self._threads[:2]:
            t.join(timeout=5)
        self.returncode = rc
        # whatever the server left behind in its group goes too
        if self.pgid is not None:
            procs.kill_group(self.pgid)
            self.leftovers = [p.pid for p in procs.wait_group_gone(self.pgid, 5.0)]
        if not self._stopping and self.state != ServerState.FAILED:
            self._set_state(ServerState.FAILED, self._exit_reason(rc))
        elif self.state != ServerState.FAILED:
            self._set_state(ServerState.STOPPED)
        self._done.set()

    def _exit_reason(self, rc: int) -> str:
        """Why the server ended: the reaper or a signal from outside named, else one of
        :data:`EXIT_REASONS`' openings with the code and the last error line of its log."""
        if self.reaper_signal is not None:
            return (f"the reaper process (pid {self.pgid}) was killed (signal {self.reaper_signal}): the server it "
                    "started was stopped with it")
        if self.server_signal is not None:
            sig = self.server_signal
            when = " after it was ready" if self.was_ready else " during startup"
            if sig == 9:
                return f"the server was killed (signal 9 — out of memory?){when}"
            return f"the server was ended by signal {sig} ({signal_name(sig)}){when}, not by vLLM Dyno"
        tail = self.log_tail(200)
        msg = ""
        for line in reversed(tail):
            if _ERROR_RE.search(line) and not _ACCESS_RE.search(line) and not _WARNING_RE.search(line.strip()):
                msg = line.strip()
                break
        if self.was_ready:
            said = f" after /health answered {self.dead_health}" if self.dead_health else ""
            reason = f"the server was ready, then exited with code {rc}{said}: its engine died"
        else:
            reason = f"the server exited with code {rc} during startup"
        if msg:
            reason += f": {msg}"
        return reason  # the diagnosis is the run controller's (app.run.controller), one place

    # ------------------------------------------------------------------ waiting
    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until ready (True) or failed/stopped/timeout (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ready.is_set() and self.state == ServerState.READY:
                return True
            if self._done.is_set() or self.state == ServerState.FAILED:
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def wait_done(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    # ------------------------------------------------------------------ stop
    def stop(self, grace: float | None = None) -> list[int]:
        """Stop the server; return pids of group members still alive afterwards (should be []).

        SIGTERM to the server's main process (through the reaper), wait ``grace`` s
        (default ``self.grace``), SIGKILL the group, verify with psutil.
        """
        grace = self.grace if grace is None else grace
        proc = self._proc
        if proc is None:
            return []
        with self._lock:
            already = self._stopping
            self._stopping = True
        if not already and proc.poll() is None:
            self._set_state(ServerState.STOPPING)
            try:
                proc.stdin.write(b"term\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("server did not stop within %.0f s; SIGKILL to its group", grace)
        if self.pgid is not None:
            procs.kill_group(self.pgid)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._done.wait(15)
        try:
            proc.stdin.close()
        except Exception:
            pass
        left = procs.wait_group_gone(self.pgid, 5.0) if self.pgid is not None else []
        self.leftovers = [p.pid for p in left]
        if self.state not in (ServerState.FAILED, ServerState.STOPPED):
            self._set_state(ServerState.STOPPED)
        return self.leftovers

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

