"""The app's side of an agent: start ``vllm-dyno agent`` on a host and talk to it.

:meth:`AgentLink.open` connects — over SSH through asyncssh for a remote host, as a
local process for ``localhost`` — starts the agent (``<dyno> agent``), reads its
``hello``, refuses another vllm-dyno version naming both, and measures the clock offset
with a few pings (app.hosts.protocol). Then: :meth:`AgentLink.watch` (telemetry),
:meth:`AgentLink.launch` (the server's part on that host), :meth:`AgentLink.stop`,
:meth:`AgentLink.close`. Samples, log lines and states arrive on the session clock.

SSH (:class:`SshOptions`): keys from the user's SSH agent, ``~/.ssh/config`` and the
default identity files — never a password (password and keyboard-interactive
authentication are off, so nothing can prompt); host keys are checked against
``known_hosts``. Every failure is a :class:`HostError` that names the host and the fix
(:func:`ssh_error`). Keepalives (:data:`KEEPALIVE_S` × :data:`KEEPALIVE_COUNT`) notice a
host that went away.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import shlex
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from cryptography.utils import CryptographyDeprecationWarning

with warnings.catch_warnings():
    # asyncssh 2.x names DSA key classes at import, which cryptography ≥ 43 deprecates
    # (asyncssh/crypto/misc.py, dsa.py): five warnings at every start of the app that say
    # nothing about it (issue 37); cryptography is asyncssh's own dependency
    warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)")
    import asyncssh

from app import __version__
from app.clock import SessionClock
from app.config import ServerConfig
from app.engines import Engine
from app.helper_process import helper_argv
from app.hosts.protocol import (PROTOCOL, ClockOffset, ProtocolError, best_offset, clock_sample, decode, encode,
                                samples_from_wire)
from app.hosts.spec import Host
from app.telemetry.series import Sample, Subscriber, publish

log = logging.getLogger(__name__)

#: seconds between SSH keepalives, and how many may go unanswered before the
#: connection counts as lost (a host that went away is noticed within their product)
KEEPALIVE_S = 5.0
KEEPALIVE_COUNT = 3
#: pings of one clock-offset measurement
CLOCK_PINGS = 8
#: seconds between two measurements of a host's clock offset (:meth:`AgentLink.keep_clock`)
CLOCK_INTERVAL_S = 60.0
#: how long a request waits for its reply, s (a stop waits its grace on top)
REQUEST_TIMEOUT_S = 30.0


class HostError(RuntimeError):
    """A host that cannot be used: the message names it and says what to do."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"host {host}: {message}")
        self.host = host


@dataclass(frozen=True)
class SshOptions:
    """How to reach hosts over SSH. ``known_hosts``: the known-hosts file (None: the
    user's ``~/.ssh/known_hosts``); ``client_keys``: private key files (None: the SSH
    agent, ``~/.ssh/config``'s IdentityFile and the default ``~/.ssh/id_*``);
    ``use_agent``: ask the SSH agent (``SSH_AUTH_SOCK``); ``config``: ssh_config files
    (None: ``~/.ssh/config``); ``connect_timeout``: seconds; ``keepalive_s`` ×
    ``keepalive_count``: seconds between keepalives and how many may go unanswered."""

    known_hosts: Optional[str] = None
    client_keys: Optional[tuple[str, ...]] = None
    use_agent: bool = True
    config: Optional[tuple[str, ...]] = None
    connect_timeout: float = 15.0
    keepalive_s: float = KEEPALIVE_S
    keepalive_count: int = KEEPALIVE_COUNT

    def connect_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"password_auth": False, "kbdint_auth": False,
                              "connect_timeout": self.connect_timeout,
                              "keepalive_interval": self.keepalive_s, "keepalive_count_max": self.keepalive_count}
        if self.known_hosts is not None:
            kw["known_hosts"] = self.known_hosts
        if self.client_keys is not None:
            kw["client_keys"] = list(self.client_keys)
        if not self.use_agent:
            kw["agent_path"] = None
        if self.config is not None:
            kw["config"] = list(self.config)
        return kw


def _known_hosts_name(opts: SshOptions) -> str:
    return opts.known_hosts or "~/.ssh/known_hosts"


def ssh_error(host: Host, e: BaseException, opts: SshOptions) -> HostError:
    """An SSH or network failure as a :class:`HostError` naming the host and the fix."""
    where = host.label()
    port = "" if host.port == 22 else f" -p {host.port}"
    dest = f"{host.user}@{host.hostname}" if host.user else host.hostname
    if isinstance(e, asyncssh.HostKeyNotVerifiable):
        return HostError(where, f"its host key is not in {_known_hosts_name(opts)} ({e.reason}). Check the key's "
                                f"fingerprint with the host's administrator, then accept it: connect once with "
                                f"`ssh{port} {dest}`, or add it with `ssh-keyscan{port} {host.hostname} >> "
                                f"{_known_hosts_name(opts)}`")
    if isinstance(e, asyncssh.PermissionDenied):
        return HostError(where, f"the SSH server refused every key offered ({e.reason}); vLLM Dyno authenticates "
                                f"with keys only: load yours into your SSH agent (ssh-add), name it in ~/.ssh/config "
                                f"(IdentityFile), and install it there (ssh-copy-id{port} {dest})")
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return HostError(where, f"no SSH answer within {opts.connect_timeout:.0f} s: check the address and port, "
                                "and that the host is up and reachable from here")
    if isinstance(e, OSError):
        what = e.strerror or str(e)
        return HostError(where, f"cannot connect to {host.hostname} port {host.port} ({what}): check the address "
                                "and port in hosts[].ssh, that the host is up and that its SSH server runs")
    if isinstance(e, asyncssh.Error):
        return HostError(where, f"SSH failed: {e.reason or type(e).__name__}")
    return HostError(where, f"{type(e).__name__}: {e}")


class _Channel:
    """The agent's stdin/stdout/stderr, over SSH or a local pipe."""

    def __init__(self, stdin: Any, stdout: Any, stderr: Any, wait: Callable[[], Any], abort: Callable[[], None],
                 close: Callable[[], Any], pid: int | None = None) -> None:
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.wait, self.abort, self.close, self.pid = wait, abort, close, pid


async def _open_local(host: Host) -> _Channel:
    words = shlex.split(host.dyno)
    argv = helper_argv("app.cli") + ["agent"] if words == ["vllm-dyno"] else words + ["agent"]
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    start_new_session=True, limit=1 << 20)
    except OSError as e:
        raise HostError(host.label(), f"cannot start the agent {argv[0]!r}: {e.strerror or e}") from e

    async def close() -> None:
        if proc.stdin and not proc.stdin.is_closing():
            proc.stdin.close()

    def abort() -> None:
        if proc.returncode is None:
            proc.kill()

    return _Channel(proc.stdin, proc.stdout, proc.stderr, proc.wait, abort, close, proc.pid)


async def _open_ssh(host: Host, opts: SshOptions) -> tuple[_Channel, Any]:
    try:
        conn = await asyncssh.connect(host.hostname, port=host.port, username=host.user, **opts.connect_kwargs())
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
        raise ssh_error(host, e, opts) from None
    try:
        proc = await conn.create_process(host.agent_command(), encoding=None)
    except (OSError, asyncssh.Error) as e:
        conn.abort()
        raise ssh_error(host, e, opts) from None

    async def wait() -> int | None:
        done = await proc.wait()
        return done.exit_status

    async def close() -> None:
        if not proc.stdin.is_closing():
            proc.stdin.write_eof()

    return _Channel(proc.stdin, proc.stdout, proc.stderr, wait, conn.abort, close), conn


@dataclass
class _Pending:
    fut: asyncio.Future
    op: str


@dataclass
class AgentLink:
    """One host's agent, started and spoken to. Built by :meth:`open` (never directly).

    ``hello``: the agent's hello (version, hostname, cards, cpu); ``offset``: the clock
    offset (agent − app, s) with its bound; ``source_prefix``: put before every sample's
    source (``"<host>/"``; empty for localhost) so the series of several hosts stay
    apart; ``log_lines``: the last lines of its server (session s, stream, text);
    ``states``: the server's state messages; ``stderr_tail``: the agent's own stderr."""

    host: Host
    clock: SessionClock
    channel: _Channel
    connection: Any = None
    hello: dict[str, Any] = field(default_factory=dict)
    offset: Optional[ClockOffset] = None
    source_prefix: str = ""
    log_lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=5000))
    states: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=50))
    #: every offset measured, ``(session s, ClockOffset)``: the drift between two clocks
    offsets: list[tuple[float, ClockOffset]] = field(default_factory=list)
    _subs: list[Subscriber] = field(default_factory=list)
    _log_subs: list[tuple[Optional[str], Callable[[str, str, float], None]]] = field(default_factory=list)
    _state_subs: list[tuple[Optional[str], Callable[[dict[str, Any]], None]]] = field(default_factory=list)
    _lost_subs: list[Callable[[str, str], None]] = field(default_factory=list)
    #: why the link ended when it was not closed on purpose (None while up or after close)
    lost: Optional[str] = None
    #: bytes of the agent's lines read since the hello (its telemetry, replies, log lines)
    bytes_received: int = 0
    _closing: bool = False
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _wlock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False

    # ------------------------------------------------------------------ opening
    @classmethod
    async def open(cls, host: Host, *, clock: SessionClock | None = None, ssh: SshOptions | None = None,
                   hello_timeout: float = 60.0, pings: int = CLOCK_PINGS) -> "AgentLink":
        """Start the agent on ``host`` and check it (version, protocol); measure the clock
        offset. Raises :class:`HostError`."""
        opts = ssh or SshOptions()
        conn = None
        if host.is_local:
            chan = await _open_local(host)
        else:
            chan, conn = await _open_ssh(host, opts)
        link = cls(host, clock or SessionClock(), chan, conn,
                   source_prefix="" if host.is_local else f"{host.hostname}/")
        link._tasks.append(asyncio.ensure_future(link._read_stderr()))
        try:
            await link._read_hello(hello_timeout)
            link._tasks.append(asyncio.ensure_future(link._read_loop()))
            await link.measure_clock(pings)
        except BaseException:
            await link.abort()
            raise
        return link

    async def _read_hello(self, timeout: float) -> None:
        where = self.host.label()
        try:
            line = await asyncio.wait_for(self.channel.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise HostError(where, f"the agent said nothing within {timeout:.0f} s ({self.host.agent_command()})"
                            ) from None
        except (OSError, asyncssh.Error) as e:
            raise ssh_error(self.host, e, SshOptions()) from None
        if not line:
            rc = await self._exit_status(5.0)
            await asyncio.sleep(0.1)  # the last stderr lines
            said = " | ".join(self.stderr_tail) or "nothing on stderr"
            raise HostError(where, f"the agent did not start: `{self.host.agent_command()}` exited with {rc} "
                                   f"({said}). Install vllm-dyno {__version__} there, or set hosts[].dyno to the "
                                   "command that runs it")
        try:
            hello = decode(line)
        except ProtocolError:
            raise HostError(where, f"the agent's first line is not its hello: {line[:120]!r} — does a login script "
                                   "there print on stdout? Make it quiet for non-interactive shells") from None
        if hello.get("op") != "hello":
            raise HostError(where, f"the agent's first message is {hello.get('op')!r}, not hello")
        theirs = hello.get("version")
        if theirs != __version__:
            raise HostError(where, f"runs vllm-dyno {theirs}, this app is vllm-dyno {__version__}: install the "
                                   f"same version on every host (pip install vllm-dyno=={__version__} there)")
        if hello.get("protocol") != PROTOCOL:
            raise HostError(where, f"its agent speaks protocol {hello.get('protocol')}, this app {PROTOCOL}: install "
                                   f"the same vllm-dyno there as here ({__version__}, from the same source)")
        self.hello = hello

    async def _exit_status(self, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self.channel.wait(), timeout)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            return None

    # ------------------------------------------------------------------ reading
    async def _read_stderr(self) -> None:
        try:
            while True:
                line = await self.channel.stderr.readline()
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip()
                self.stderr_tail.append(text)
                log.debug("agent %s: %s", self.host.label(), text)
        except (OSError, asyncssh.Error, asyncio.CancelledError):
            return

    async def _read_loop(self) -> None:
        why = "the agent's channel closed"
        try:
            while True:
                line = await self.channel.stdout.readline()
                if not line:
                    break
                self.bytes_received += len(line)
                try:
                    self._dispatch(decode(line))
                except ProtocolError as e:
                    log.warning("host %s: %s", self.host.label(), e)
        except (OSError, asyncssh.Error) as e:
            why = f"the SSH connection was lost ({e})"
        except asyncio.CancelledError:
            why = "the link was closed"
        self.closed = True
        tail = " | ".join(list(self.stderr_tail)[-3:])
        for p in list(self._pending.values()):
            if not p.fut.done():
                p.fut.set_exception(HostError(self.host.label(), why + (f": {tail}" if tail else "")))
        self._pending.clear()
        if not self._closing:
            self.lost = why
            log.warning("host %s: %s", self.host.label(), why)
            for cb in list(self._lost_subs):
                try:
                    cb(self.host.label(), why)
                except Exception:  # a subscriber must not break the link's teardown
                    log.exception("lost-host subscriber failed")

    @property
    def shift(self) -> float:
        """Seconds added to the agent's time stamps to put them on the session clock:
        −offset − session t0 (0 offset until measured)."""
        return -(self.offset.offset_s if self.offset else 0.0) - self.clock.t0

    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        rid = msg.get("id")
        if rid is not None and rid in self._pending:
            p = self._pending.pop(rid)
            if not p.fut.done():
                p.fut.set_result(msg)
            return
        if op == "samples":
            samples = samples_from_wire(msg.get("samples") or [], self.shift)
            if self.source_prefix:
                samples = [Sample(s.t, self.source_prefix + s.source, s.name, s.value) for s in samples]
            publish(self._subs, samples)
        elif op == "log":
            t = float(msg.get("t", 0.0)) + self.shift
            self.log_lines.append((t, msg.get("stream", ""), msg.get("text", "")))
            for part, cb in list(self._log_subs):
                if part is None or part == msg.get("part", "server"):
                    cb(msg.get("stream", ""), msg.get("text", ""), t)
        elif op == "state":
            st = {**msg, "t": float(msg.get("t", 0.0)) + self.shift}
            self.states.append(st)
            for part, cb in list(self._state_subs):
                if part is None or part == st.get("part", "server"):
                    cb(st)
        elif op == "error":
            log.warning("host %s: %s", self.host.label(), msg.get("message"))

    # ------------------------------------------------------------------ subscribing
    def subscribe(self, cb: Subscriber) -> Subscriber:
        """``cb(samples)`` for every batch of samples (session clock, sources prefixed)."""
        self._subs.append(cb)
        return cb

    def on_log(self, cb: Callable[[str, str, float], None], part: Optional[str] = None) -> None:
        """``cb(stream, text, t)`` for each line of ``part`` (``server``/``ray``; None: all)."""
        self._log_subs.append((part, cb))

    def on_state(self, cb: Callable[[dict[str, Any]], None], part: Optional[str] = None) -> None:
        """``cb(state message)`` for each state of ``part`` (``server``/``ray``; None: all)."""
        self._state_subs.append((part, cb))

    def on_lost(self, cb: Callable[[str, str], None]) -> None:
        """``cb(host, why)`` once when the link ends without :meth:`close` or
        :meth:`abort`: the agent died, or the host dropped (no keepalive answered)."""
        self._lost_subs.append(cb)

    # ------------------------------------------------------------------ requests
    async def send(self, msg: dict[str, Any]) -> None:
        """Write one message (no reply awaited)."""
        async with self._wlock:
            self.channel.stdin.write(encode(msg))
            await self.channel.stdin.drain()

    async def request(self, op: str, *, timeout: float = REQUEST_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        """Send ``op`` and wait for its reply; an ``error`` reply raises :class:`HostError`."""
        if self.closed:
            raise HostError(self.host.label(), "the agent's channel is closed")
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(fut, op)
        try:
            await self.send({"op": op, "id": rid, **fields})
        except (OSError, asyncssh.Error) as e:
            self._pending.pop(rid, None)
            raise HostError(self.host.label(), f"cannot write to the agent: {e}") from None
        try:
            reply = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            raise HostError(self.host.label(), f"the agent did not answer {op} within {timeout:.0f} s") from None
        if reply.get("op") == "error":
            raise HostError(self.host.label(), str(reply.get("message")))
        return reply

    async def measure_clock(self, pings: int = CLOCK_PINGS) -> ClockOffset:
        """``pings`` ping exchanges; the offset of the fastest (app.hosts.protocol)."""
        out = []
        loop_clock = self.clock
        for _ in range(max(1, pings)):
            t0 = loop_clock.t0 + loop_clock.now()  # raw monotonic seconds
            reply = await self.request("ping", t0=t0)
            t3 = loop_clock.t0 + loop_clock.now()
            out.append(clock_sample(t0, float(reply["t1"]), float(reply["t2"]), t3))
        self.offset = best_offset(out)
        self.offsets.append((self.clock.now(), self.offset))
        return self.offset

    def keep_clock(self, interval: float = CLOCK_INTERVAL_S) -> None:
        """Measure the offset again every ``interval`` s while the link is up (monotonic
        clocks of two machines drift apart: 50 ppm is 0.18 s an hour); samples use the
        newest. Stopped by :meth:`close` and :meth:`abort`."""
        async def loop() -> None:
            while not self.closed:
                await asyncio.sleep(interval)
                try:
                    await self.measure_clock()
                except HostError:
                    return
        self._tasks.append(asyncio.ensure_future(loop()))

    @property
    def drift_ppm(self) -> float | None:
        """The agent's clock rate against the app's from the first and the newest offset,
        parts per million (None before two measurements 1 s apart)."""
        if len(self.offsets) < 2 or self.offsets[-1][0] - self.offsets[0][0] < 1.0:
            return None
        (ta, a), (tb, b) = self.offsets[0], self.offsets[-1]
        return (b.offset_s - a.offset_s) / (tb - ta) * 1e6

    async def probe(self, model: str | None = None) -> dict[str, Any]:
        """What a launch plan checks on the host (app.hosts.agent.probe): its vLLM (with the
        host's ``python``), ``/dev/shm``, interfaces, and whether ``model`` is there."""
        return await self.request("probe", python=self.host.python, model=model, timeout=90.0)

    async def watch(self, interval: float = 1.0, gpu_interval: float = 0.5) -> dict[str, Any]:
        """Start the host's telemetry (host every ``interval`` s, cards every
        ``gpu_interval`` s where NVML works there)."""
        return await self.request("watch", interval=interval, gpu_interval=gpu_interval)

    async def launch(self, config: ServerConfig, *, engine: Engine | str = Engine.VLLM, python: str | None = None,
                     sim_args: list[str] | None = None, expose: bool = False,
                     startup_timeout: float = 900.0, part: str = "server",
                     fill_defaults: bool = False) -> dict[str, Any]:
        """Start this host's server (``part`` ``server``) or its Ray node (``part`` ``ray``,
        engine ``ray``, ``ray start``'s arguments in ``sim_args``) through its agent (a
        supervisor and reaper each). A bind beyond loopback needs ``expose`` (the user's
        confirmation). ``fill_defaults``: the agent fills in the CPU build's working
        defaults where ``config`` sets nothing, for its host's interpreter and cores
        (app.hosts.agent.cpu_defaults; the server part only). Returns ``launched`` (part,
        pid, pgid, port, url, argv, ``defaults``: None, or what was filled in as ``{"fix",
        "chosen", "notes"}``)."""
        return await self.request("launch", part=part, engine=Engine(engine).value,
                                  config=config.model_dump(mode="json"),
                                  python=python if python is not None else self.host.python,
                                  sim_args=list(sim_args or []), expose=expose, startup_timeout=startup_timeout,
                                  fill_defaults=fill_defaults)

    async def wait_state(self, *states: str, timeout: float = 120.0) -> dict[str, Any]:
        """The first state message in ``states`` (e.g. ready, failed); HostError on timeout."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for st in self.states:
                if st.get("state") in states:
                    return st
            if self.closed:
                raise HostError(self.host.label(), f"the agent's channel closed before the server was {states[0]}")
            if asyncio.get_running_loop().time() > deadline:
                raise HostError(self.host.label(), f"the server was not {' or '.join(states)} within {timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def stop(self, grace: float = 20.0) -> list[int]:
        """Stop this host's parts; the pids of their groups still alive after (should be [])."""
        reply = await self.request("stop", grace=grace, timeout=grace + 30.0)
        return list(reply.get("leftovers") or [])

    async def close(self, timeout: float = 30.0) -> None:
        """Say bye (the agent stops its server and exits), then close the connection."""
        self._closing = True
        if not self.closed:
            try:
                await self.request("bye", timeout=timeout)
            except HostError:
                pass
        try:
            await self.channel.close()
        except (OSError, asyncssh.Error):
            pass
        await self._exit_status(timeout)
        await self._finish()

    async def abort(self) -> None:
        """Drop the channel at once (as a lost network or a killed app would): the agent
        sees its input end and stops its server; killed meanwhile, its reaper does."""
        self._closing = True
        self.channel.abort()
        if self.connection is None:  # a local agent: reap it (its pipes close with it)
            await self._exit_status(5.0)
        await self._finish()

    async def _finish(self) -> None:
        if self.connection is not None:
            self.connection.close()
            try:
                await asyncio.wait_for(self.connection.wait_closed(), 5.0)
            except (asyncio.TimeoutError, OSError, asyncssh.Error):
                pass
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.closed = True

    @property
    def agent_pid(self) -> int | None:
        """The agent's pid on its host (from its hello)."""
        return self.hello.get("pid")

