"""The agent: ``vllm-dyno agent`` on each host of a rig (issue 21, item 2).

Started by the app over SSH (or as a local process for ``localhost``), it speaks the
line protocol of :mod:`app.hosts.protocol` on its stdin/stdout and opens no port. It
says ``hello`` (its version, host name, cards from NVML, the CPU build's cores and
memory), answers pings for the clock offset, sends the host's and the cards' samples
(the samplers of app.telemetry, stamped on its own monotonic clock), launches its part
of the server — vLLM or the simulated rig, and for the Ray backend the host's ``ray start
--block`` node (app.hosts.plan.ray_plan) — through the one supervisor
(:class:`app.server.supervisor.Supervisor`: the reaper, its own process group; one per
part, :data:`PARTS`) and streams their log lines and states back, each with its part.

Its life is the channel's (docs/design.md, "Hosts and the agent"): stdin at EOF (the
SSH channel closed, the app gone), SIGHUP or SIGTERM → it stops its server (SIGTERM,
:data:`SHUTDOWN_GRACE_S`, SIGKILL to the group) and exits. Killed outright, it cannot;
then the reaper does it: the supervisor holds the reaper's stdin, which closes with
the agent, and the reaper ends the server (SIGTERM, 3 s, SIGKILL to the group,
app.server.reaper). The protocol owns the real stdout; the agent's fd 1 is pointed at
its stderr so that nothing else can write into the protocol.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, BinaryIO

import psutil

from app import __version__
from app.clock import SessionClock
from app.config import ServerConfig, exposure_problem
from app.engines import AGENT_ENGINES, Engine, names
from app.hosts.protocol import PROTOCOL, ProtocolError, decode, encode, samples_to_wire
from app.planner.cards import host_cores, node_memory
from app.planner.launch_defaults import LaunchDefaults, cpu_build_defaults
from app.server.interpreter import InterpreterError, inspect_interpreter, ray_interpreter, resolve_python
from app.server.launch import LaunchError
from app.server.reaper import EOF_GRACE_S
from app.server.supervisor import StateChange, Supervisor
from app.telemetry.gpu_sampler import GpuSampler
from app.telemetry.host_sampler import HostSampler
from app.telemetry.nvml import NvmlUnavailable, read_cards
from app.telemetry.nvml_source import NvmlSource
from app.telemetry.series import Sample

log = logging.getLogger(__name__)

#: seconds the agent gives its server between SIGTERM and SIGKILL when its channel
#: closes: the reaper's own grace, so either path ends the server as fast
SHUTDOWN_GRACE_S = EOF_GRACE_S
#: the engines the agent launches (``attach`` launches nothing; ``ray``: ``ray start``),
#: each as its part (``Engine.spec.agent_part``)
ENGINES = AGENT_ENGINES
#: the parts an agent runs at once, one of each: ``server`` (vLLM or the sim) and ``ray``
#: (the host's Ray node, under the head's ``vllm serve`` with the Ray backend)
PARTS = tuple(dict.fromkeys(e.spec.agent_part for e in AGENT_ENGINES if e.spec.agent_part))


class _Hangup(Exception):
    """SIGHUP or SIGTERM reached the agent: stop the server and exit."""


def agent_clock() -> SessionClock:
    """The clock the agent stamps everything with: raw ``time.monotonic()`` seconds
    (origin 0), so the app maps it with one offset (app.hosts.protocol)."""
    return SessionClock(t0=0.0, wall0=time.time() - time.monotonic())


def host_facts(indices: list[int] | None = None) -> dict[str, Any]:
    """What ``hello`` reports of this host: ``cards`` (NVML, [] without it), ``nvml``
    (None, or why not), ``cpu`` (the CPU build's view: cores this process may use,
    the NUMA node's memory in GiB, app.planner.cards)."""
    cards: list[dict[str, Any]] = []
    why: str | None = None
    try:
        info = read_cards(indices)
        cards = [{"index": c.index, "name": c.name, "memory_total_bytes": c.memory_total_bytes,
                  "memory_used_bytes": c.memory_used_bytes,
                  "compute_capability": list(c.compute_capability) if c.compute_capability else None}
                 for c in info.cards]
    except (NvmlUnavailable, ValueError) as e:
        why = getattr(e, "message", None) or str(e)
    mem = node_memory()
    return {"cards": cards, "nvml": why,
            "cpu": {"cores": host_cores(), "memory_total_gib": round(mem.total_gib, 3),
                    "memory_available_gib": round(mem.available_gib, 3), "node": mem.node}}


def probe(python: str | None, model: str | None) -> dict[str, Any]:
    """What a launch plan checks on this host: ``vllm`` (the interpreter's vLLM: python,
    version, distribution, launch form, ``cpu_build``, ``ray`` — the version of Ray installed
    for that interpreter or None — or ``error`` with ``ray`` still, app.server.interpreter), ``shm``
    (``/dev/shm`` total and free bytes, None without it), ``interfaces`` (name → its
    non-loopback addresses, psutil), ``model`` (``path`` and ``exists`` for a local path;
    None for a Hugging Face id, which is not looked up)."""
    try:
        vi = inspect_interpreter(resolve_python(python))
        vllm: dict[str, Any] = {"python": vi.python, "version": vi.version, "distribution": vi.distribution,
                                "launch_form": vi.launch_form, "cpu_build": vi.is_cpu_build, "ray": vi.ray_version}
    except InterpreterError as e:
        vllm = {"error": str(e)}
        try:  # a host's Ray node needs only Ray (a simulated rig's hosts need no vLLM)
            vllm["ray"] = ray_interpreter(resolve_python(python))[1]
        except InterpreterError:
            vllm["ray"] = None
    try:
        st = os.statvfs("/dev/shm")
        shm: dict[str, int] | None = {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}
    except OSError:
        shm = None
    ifaces: dict[str, list[str]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        ips = [a.address.split("%", 1)[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
        ips = [ip for ip in ips if not ipaddress.ip_address(ip).is_loopback]
        if ips:
            ifaces[name] = ips
    found = None
    if model:
        path = os.path.expanduser(model)
        if os.path.isabs(path) or path.startswith("."):
            found = {"path": path, "exists": os.path.isdir(path)}
    return {"vllm": vllm, "shm": shm, "interfaces": ifaces, "model": found}


def cpu_defaults(config: ServerConfig, python: str | None) -> LaunchDefaults | None:
    """The CPU build's working defaults for this host's part (the one function the local
    launch uses, :func:`app.planner.launch_defaults.cpu_build_defaults`), sized for this
    host's interpreter, NUMA node and environment: only what the profile (``config``, its
    ``env``) and the agent's environment leave unset. None when this host's vLLM is not
    the CPU build or cannot be probed (the launch then reports why). Never raises."""
    try:
        interp = inspect_interpreter(resolve_python(python))
        if not interp.is_cpu_build:
            return None
        return cpu_build_defaults(config, vllm_version=interp.version)
    except Exception:  # defaults are a help: a failure here must not stop the launch
        log.exception("could not work out the CPU build's defaults on this host")
        return None


class Agent:
    """The agent over one pair of byte streams (``rfile`` its requests, ``wfile`` its
    messages). :meth:`run` returns the exit code once the input ends or a ``bye``."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO, *, gpus: list[int] | None = None) -> None:
        self.rfile = rfile
        self.wfile = wfile
        self.gpus = gpus
        self.clock = agent_clock()
        self.parts: dict[str, Supervisor] = {}  # part (PARTS) → its supervisor
        self.host_sampler: HostSampler | None = None
        self.gpu_sampler: GpuSampler | None = None
        self.facts: dict[str, Any] = {}
        self._wlock = threading.Lock()
        self._closed = threading.Event()

    # ------------------------------------------------------------------ output
    def send(self, msg: dict[str, Any]) -> bool:
        """Write one message; False once the channel is gone (never raises)."""
        if self._closed.is_set():
            return False
        data = encode(msg)
        with self._wlock:
            try:
                self.wfile.write(data)
                self.wfile.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                self._closed.set()
                return False

    def _samples(self, samples: list[Sample]) -> None:
        self.send({"op": "samples", "samples": samples_to_wire(samples)})

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        self.facts = host_facts(self.gpus)
        self.send({"op": "hello", "protocol": PROTOCOL, "version": __version__, "hostname": socket.gethostname(),
                   "pid": os.getpid(), "python": sys.executable, "t": self.clock.now(), **self.facts})
        try:
            while not self._closed.is_set():
                line = self.rfile.readline()
                t1 = self.clock.now()
                if not line:
                    break  # EOF: the channel is closed
                try:
                    msg = decode(line)
                except ProtocolError as e:
                    self.send({"op": "error", "message": f"agent: {e}"})
                    continue
                if not self.handle(msg, t1):
                    break
        except _Hangup:
            pass
        finally:
            self.shutdown()
        return 0

    def handle(self, msg: dict[str, Any], t1: float) -> bool:
        """Answer one request (received at ``t1``, agent clock); False to end the agent."""
        op, rid = msg["op"], msg.get("id")
        reply: dict[str, Any] = {"id": rid} if rid is not None else {}
        try:
            if op == "ping":
                self.send({**reply, "op": "pong", "t0": msg.get("t0"), "t1": t1, "t2": self.clock.now()})
            elif op == "probe":
                self.send({**reply, "op": "probed", **probe(msg.get("python"), msg.get("model"))})
            elif op == "watch":
                self.send({**reply, "op": "watching", **self.watch(float(msg.get("interval", 1.0)),
                                                                  float(msg.get("gpu_interval", 0.5)))})
            elif op == "launch":
                self.send({**reply, "op": "launched", **self.launch(msg)})
            elif op == "stop":
                grace = float(msg.get("grace", 20.0))
                threading.Thread(target=self._stop_reply, args=(reply, grace), daemon=True,
                                 name="dyno-agent-stop").start()
            elif op == "bye":
                self.send({**reply, "op": "bye"})
                return False
            else:
                self.send({**reply, "op": "error", "message": f"agent: unknown op {op!r}"})
        except (LaunchError, ValueError, TypeError, KeyError) as e:
            self.send({**reply, "op": "error", "message": str(e)})
        return True

    # ------------------------------------------------------------------ ops
    def watch(self, interval: float, gpu_interval: float) -> dict[str, Any]:
        """Start the host sampler (and the GPU sampler where NVML opens) once; the
        server's process group is followed from its launch on."""
        if self.host_sampler is None:
            self.host_sampler = HostSampler(interval=interval, clock=self.clock)
            if "server" in self.parts:
                self.host_sampler.pgid = self.parts["server"].pgid
            self.host_sampler.subscribe(self._samples)
            self.host_sampler.start()
        if self.gpu_sampler is None:
            if self.facts.get("nvml") is not None:
                return {"gpu": False, "gpu_message": self.facts["nvml"]}
            self.gpu_sampler = GpuSampler(NvmlSource(self.gpus), interval=gpu_interval, clock=self.clock)
            self.gpu_sampler.subscribe(self._samples)
            self.gpu_sampler.start()  # opens NVML on its thread; a failure stops it (logged)
        return {"gpu": True}

    def launch(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Start a part (``part``: ``server``, one per agent, or ``ray``: engine ``ray``,
        ``ray start`` with ``sim_args``) through a supervisor and its reaper."""
        part = msg.get("part", "server")
        if part not in PARTS:
            raise LaunchError(f"part {part!r}: an agent runs the parts {', '.join(PARTS)}")
        running = self.parts.get(part)
        if running is not None and not running.exited:
            raise LaunchError(f"this agent already runs its {part} part; stop it first")
        asked = msg.get("engine", Engine.VLLM.value)
        engine = Engine.parse(asked)
        if engine is None or engine.spec.agent_part != part:
            runs = " and ".join(f"{names(tuple(e for e in ENGINES if e.spec.agent_part == p))} as the {p} part"
                             for p in PARTS)
            raise LaunchError(f"engine {asked!r} for part {part!r}: an agent launches {runs}")
        config = ServerConfig.model_validate(msg["config"])
        exposed = exposure_problem(config.host)
        if exposed and not msg.get("expose"):
            raise LaunchError(exposed)
        defaults = None
        if engine.runs_vllm and msg.get("fill_defaults"):
            defaults = cpu_defaults(config, msg.get("python"))
            if defaults is not None:
                config = defaults.config
        sup = Supervisor(config, engine=engine, python=msg.get("python"), sim_args=list(msg.get("sim_args") or []),
                         clock=self.clock, startup_timeout=float(msg.get("startup_timeout", 900.0)))
        sup.on_line(lambda stream, text, t: self.send({"op": "log", "part": part, "stream": stream, "text": text,
                                                       "t": t}))
        sup.on_state(lambda ch: self._state(part, sup, ch))
        sup.start()
        self.parts[part] = sup
        if self.host_sampler is not None and part == "server":
            self.host_sampler.pgid = sup.pgid
        return {"part": part, "pid": sup.server_pid, "pgid": sup.pgid, "port": sup.config.port, "url": sup.url,
                "argv": sup.argv, "defaults": defaults.as_dict() if defaults is not None else None}

    def _state(self, part: str, sup: Supervisor, ch: StateChange) -> None:
        self.send({"op": "state", "part": part, "state": ch.state.value, "t": ch.t, "reason": ch.reason,
                   "server_pid": sup.server_pid})

    def _stop_parts(self, grace: float) -> list[int]:
        """Stop every part, the server before the Ray node it runs on; the pids left."""
        parts, self.parts = self.parts, {}
        return [pid for name in PARTS if name in parts for pid in parts[name].stop(grace)]

    def _stop_reply(self, reply: dict[str, Any], grace: float) -> None:
        self.send({**reply, "op": "stopped", "leftovers": self._stop_parts(grace)})

    def shutdown(self) -> None:
        """Stop the samplers and every part (SIGTERM, :data:`SHUTDOWN_GRACE_S`, SIGKILL to
        its group); idempotent."""
        for s in (self.host_sampler, self.gpu_sampler):
            if s is not None:
                s.stop(join=False)
        self._stop_parts(SHUTDOWN_GRACE_S)


def _hangup(signum: int, frame: Any) -> None:
    raise _Hangup(signum)


def main(gpus: list[int] | None = None) -> int:
    """Run the agent on this process's stdin/stdout (``vllm-dyno agent``)."""
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything else written to stdout goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    signal.signal(signal.SIGHUP, _hangup)
    signal.signal(signal.SIGTERM, _hangup)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the app stops us through the channel
    return Agent(sys.stdin.buffer, proto_out, gpus=gpus).run()
