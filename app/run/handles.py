"""The servers a run controller sequences, as handles: what serves, apart from the order
in which :class:`app.run.controller.RunController` launches, ramps and stops it.

- :class:`ServerHandle`: what the controller asks of any server it holds — its URL and
  ``stop()`` (the pids left alive). A local server is its
  :class:`app.server.supervisor.Supervisor`; an attached one is only a URL (nothing to
  stop); a rig of hosts is a :class:`RigHandle`.
- :class:`RigHandle`: a multi-host launch (issue 21) as one object with its own state —
  every host's agent (:class:`app.hosts.rig.Rig`), the layout's checks and launch plan
  (:mod:`app.hosts.checks`, :mod:`app.hosts.plan`), each host's part started through its
  agent, the head's API server as the URL, each host's rows for the Hosts view. It tells
  its owner what happens through the callbacks it is made with (a host loading, the head
  ready, a host lost), on the rig's thread — never block in them.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Any, Callable, Protocol

from app.clock import SessionClock
from app.engines import CardSamples, Engine
from app.hosts.checks import rig_findings, socket_interfaces
from app.hosts.link import HostError, SshOptions
from app.hosts.plan import RAY_STARTED, HostCommand, PlanError, launch_plan
from app.hosts.rig import Rig
from app.hosts.spec import Host
from app.planner.diagnose import Diagnosis, diagnose
from app.planner.launch_defaults import LaunchDefaults
from app.profiles.model import HardwareFingerprint
from app.run.hardware import rig_hardware
from app.run.target import LaunchTarget
from app.server.launch import LaunchError
from app.server.supervisor import Supervisor, health_status
from app.telemetry.gpu_source import GpuSource
from app.telemetry.http_source import HttpGpuSource
from app.telemetry.hub import Telemetry
from app.telemetry.nvml_source import NvmlSource
from app.telemetry.series import SeriesBank

log = logging.getLogger(__name__)


def local_died(sup: Supervisor, failed: Callable[[], bool]) -> bool:
    """Whether the local server of ``sup`` died under a ramp that ended badly: its process
    has exited (or exits within 5 s while ``/health`` does not answer) or ``/health``
    answers 5xx — then ``failed()`` (waits for the supervisor's failure, diagnosed from
    its log). False when it was stopped on request or answers."""
    deadline = time.monotonic() + 5.0  # a server that does not answer: exiting, or only slow
    while True:
        if sup.state.value in ("stopping", "stopped"):
            return False  # stopped on request (a failure stays "failed")
        if sup.state.value == "failed" or sup.exited:
            return failed()
        code = health_status(sup.url)
        if code is not None:
            return failed() if code >= 500 else False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def attached_failure(url: str, records: list[Any], stop_reason: str = "") -> tuple[str, Diagnosis | None] | None:
    """Whether the attached server at ``url`` (its log is not ours) died under a ramp that
    ended badly: ``/health`` answers 5xx or nothing at all. Returns the failure — the
    reason (with the ramp's ``stop_reason``) and a diagnosis from what the failed
    ``records`` said — or None when it answers."""
    code = health_status(url, timeout=3.0)
    if code is not None and code < 500:
        return None
    said = f"/health answered {code}" if code is not None else "it stopped answering (/health too)"
    errors = [r.error for r in records if getattr(r, "error", None)][-20:]
    diag = None
    try:
        diag = diagnose(errors, after_ready=True)
    except Exception:
        log.exception("diagnosis failed")
    dead = code is not None or (diag is not None and bool(diag.evidence))  # 503, or vLLM's EngineDeadError
    what = "its engine died" if dead else "it died or cannot be reached"
    reason = f"the server at {url} was ready, then {said}: {what}" + (f" — the ramp: {stop_reason}"
                                                                      if stop_reason else "")
    if diag is not None and diag.problem == "engine_dead":
        got = f" (the requests got: {diag.evidence[0]})" if diag.evidence else ""
        diag.explanation = (f"the server was ready, then {said}: {what}{got}. It cannot serve any more; the "
                            f"cause is in its own log, which is not read when attached: `vllm-dyno diagnose "
                            f"LOGFILE` finds it.")
    return reason, diag


def session_telemetry(target: LaunchTarget, sup: Supervisor | None, *, clock: SessionClock, bank: SeriesBank,
                      url: str | None, at_ready: bool, sim: bool, rig: bool) -> Telemetry:
    """The telemetry of a server (not started): its cards from the sim rig's HTTP source
    (a sim, launched or attached — ``sim``: ``/sim/info`` answered — once ready) or
    through NVML (``target.use_nvml``, not the CPU build, not a ``rig``: a rig's cards come
    from its agents), ``/metrics`` from ``url`` once ready (``at_ready``), the local
    server's process group (``sup``) — into ``bank`` on ``clock``, at the target's
    intervals (s)."""
    cpu_build = sup is not None and sup.interpreter is not None and sup.interpreter.is_cpu_build
    gpu_source: GpuSource | None = None
    if target.engine.resolved(sim).spec.card_samples is CardSamples.SIM_HTTP:
        if at_ready and url:
            gpu_source = HttpGpuSource(url)  # the rig serves its cards once it is up (attached too)
    elif target.use_nvml and not cpu_build and not rig:
        gpu_source = NvmlSource(target.config.gpus, server_pgid=sup.pgid if sup else None)
    return Telemetry(clock=clock, gpu_source=gpu_source, metrics_url=url if at_ready else None,  # /metrics from ready
                     pgid=sup.pgid if sup else None, host=sup is not None, bank=bank,
                     gpu_interval=target.gpu_interval, metrics_interval=target.metrics_interval)


class ServerHandle(Protocol):
    """A server the controller holds: ``url`` (its API server, None before it has one)
    and ``stop()``, which ends it and returns the pids still alive after."""

    @property
    def url(self) -> str | None: ...

    def stop(self) -> list[int]: ...


def part_key(cmd: HostCommand) -> str:
    """A part's key in :attr:`RigHandle.parts`: its host's label (``"H ray"`` for the
    host's Ray node)."""
    return cmd.host.label() + (" ray" if cmd.part == "ray" else "")


class RigHandle:
    """A launch over two or more hosts through their agents.

    ``hosts``: the profile's rig (the head first); ``clock``: the session clock; ``ssh``:
    how they are reached; ``grace``: s, SIGTERM → SIGKILL of each host's part. Callbacks
    (the rig's thread): ``on_line(stream, text, t)`` a line of a host's part, tagged
    ``[host]``/``[host ray]``; ``emit(name, *args)`` a :class:`app.run.events.RunListener`
    event (``on_launch_defaults``, ``on_rig_part``); ``on_loading(host)`` a host's part
    is loading; ``on_ready()`` the head's API server answers; ``on_failed(host, what)``
    a host was lost or its part failed or stopped; ``failure()`` the owner's failure
    reason so far (None: none) — the Ray cluster's wait gives up on it.

    State: ``rig`` (None once closed), ``plan`` (the parts launched, head first),
    ``parts`` (:func:`part_key` → its agent's ``launched`` reply), ``probes`` (each host's
    probe, in the hosts' order), ``url`` (the head's API server), ``stopping``."""

    def __init__(self, hosts: list[Host], *, clock: SessionClock, ssh: SshOptions | None = None, grace: float = 20.0,
                 on_line: Callable[[str, str, float], None] = lambda *_: None,
                 emit: Callable[..., None] = lambda *_: None,
                 on_loading: Callable[[str], None] = lambda _: None,
                 on_ready: Callable[[], None] = lambda: None,
                 on_failed: Callable[[str, str], None] = lambda *_: None,
                 failure: Callable[[], str | None] = lambda: None) -> None:
        self.rig: Rig | None = Rig(hosts, clock=clock, ssh=ssh)
        self.hosts = list(hosts)
        self.grace = grace
        self.plan: list[HostCommand] = []
        self.parts: dict[str, dict[str, Any]] = {}
        self.probes: list[dict[str, Any]] = []
        self.url: str | None = None
        self.stopping = False
        self._last: list[dict[str, Any]] = []  # status() as the rig was closed
        self._on_line, self._emit = on_line, emit
        self._on_loading, self._on_ready, self._on_failed, self._failure = on_loading, on_ready, on_failed, failure

    # ------------------------------------------------------------------ launch
    def launch(self, target: LaunchTarget, *, bank: SeriesBank | None = None,
               samples: Callable[[list[Any]], None] | None = None) -> str | None:
        """Start the server of ``target`` over its hosts: open every host's agent, probe
        them and refuse a layout with an error finding (app.hosts.checks), make the launch
        plan of the config's backend (app.hosts.plan.launch_plan; NCCL/Gloo on the
        interface that holds each host's address), start the head's part, then the others'
        (the headless parts connect to the head's data-parallel RPC port or torch.distributed
        master, which the head opens), and follow every part's state and every agent's
        channel. The Ray backend: each host's ``ray start --block`` node first (the agent's
        ``ray`` part, supervised and reaped as the server is), then — once every node said
        :data:`RAY_STARTED` within ``rig_timeout`` — the head's ``vllm serve``. With
        ``bank``/``samples`` every host's telemetry goes there (session-clock samples).
        Returns the head's URL (also :attr:`url`, set as soon as the head's part started).
        Raises LaunchError (an agent that cannot be started, a finding, a plan the hosts
        cannot run, a part the agent refused: each names the host); the caller closes the
        handle."""
        rig = self.rig
        assert rig is not None, "a closed rig is not launched again"
        try:
            rig.open(timeout=target.rig_timeout)
        except HostError as e:  # names the host and the fix
            raise LaunchError(str(e)) from None
        rig.on_lost(self._host_lost)
        probes = [rig.call(link.probe(target.config.model), target.rig_timeout) for link in rig.links]
        self.probes = probes
        try:
            plan = launch_plan(target.hosts, target.config, ray_address=target.ray_address,
                               interfaces=socket_interfaces(target.hosts, probes))
        except PlanError as e:
            raise LaunchError(str(e)) from None
        # the rig's problems, each host's command against its vLLM version included
        errors = [f for f in rig_findings(target.hosts, probes, plan, engine=target.engine) if f.level == "error"]
        if errors:
            raise LaunchError("the rig cannot run this launch: " + "; ".join(str(f) for f in errors))
        self.plan = plan
        if bank is not None:
            rig.subscribe(bank)
            if samples is not None:
                rig.subscribe(samples)
            rig.watch()
        links = {link.host.label(): link for link in rig.links}
        started: dict[str, threading.Event] = {}  # a Ray node's host → it said RAY_STARTED
        for cmd in plan:  # the head first: the others join it (Ray: the nodes, then the head's server)
            h, ray = cmd.host.label(), cmd.kind == "ray"
            link = links[h]
            if not ray and started:
                self.wait_ray_cluster(started, target.rig_timeout)
            tag = f"[{h} ray]" if ray else f"[{h}]"
            if ray:
                started[h] = threading.Event()
            link.on_log(functools.partial(self.line, tag, started=started.get(h) if ray else None), part=cmd.part)
            link.on_state(functools.partial(self._on_host_state, h, cmd.role), part=cmd.part)
            try:  # the CPU build's working defaults: each agent for its own host (its interpreter, cores)
                launched = rig.call(link.launch(cmd.config, engine=Engine.RAY if ray else target.engine,
                                                sim_args=list(cmd.args) if ray else target.sim_args, part=cmd.part,
                                                expose=target.expose, startup_timeout=target.startup_timeout,
                                                fill_defaults=(not ray and target.fill_defaults
                                                               and target.engine.runs_vllm)),
                                    target.rig_timeout)
            except HostError as e:
                raise LaunchError(f"host {h} ({cmd.role}) did not start its part: {e}") from None
            self.parts[part_key(cmd)] = launched
            if cmd.role == "head":
                self.url = launched["url"]
            d = launched.get("defaults")
            if d and (d.get("chosen") or d.get("notes")):
                self._emit("on_launch_defaults", LaunchDefaults(config=cmd.config, fix=d.get("fix") or {},
                                                                chosen=list(d.get("chosen") or []),
                                                                notes=list(d.get("notes") or []), host=h))
            self._emit("on_rig_part", {"host": h, "role": cmd.role, "rank": cmd.rank, **launched})
        return self.url

    def line(self, tag: str, stream: str, text: str, t: float, started: threading.Event | None) -> None:
        """The rig's thread: a line of a host's part (``t``: session-clock s); a Ray
        node's :data:`RAY_STARTED` sets ``started``."""
        if started is not None and RAY_STARTED in text:
            started.set()
        self._on_line(stream, f"{tag} {text}", t)

    def wait_ray_cluster(self, started: dict[str, threading.Event], timeout: float) -> None:
        """Wait until every Ray node of the plan said :data:`RAY_STARTED` (its ``ray start``
        log); raises LaunchError naming the hosts not up within ``timeout`` s, or the owner's
        failure (a node's part that failed fails the run first)."""
        deadline = time.monotonic() + timeout
        while not all(e.is_set() for e in started.values()):
            failed = self._failure()
            if failed is not None:
                raise LaunchError(failed)
            if time.monotonic() > deadline:
                late = ", ".join(h for h, e in started.items() if not e.is_set())
                raise LaunchError(f"the Ray cluster did not come up within {timeout:.0f} s: host(s) {late} never "
                                  f"said {RAY_STARTED!r} (see their [host ray] log lines); check that each host "
                                  "reaches the head's Ray port, or raise the rig timeout")
            time.sleep(0.1)

    def _on_host_state(self, host: str, role: str, st: dict[str, Any]) -> None:
        """The rig's thread: a host's server part changed state (its agent's message)."""
        state = st.get("state")
        if self.rig is None or self.stopping:
            return
        if state == "loading":
            self._on_loading(host)
        elif state == "ready" and role == "head":
            self._on_ready()
        elif state == "failed":
            self._on_failed(host, f"its server part ({role}) failed: {st.get('reason') or 'no reason given'}")
        elif state == "stopped":
            self._on_failed(host, f"its server part ({role}) stopped")

    def _host_lost(self, host: str, why: str) -> None:
        """The rig's thread: a host's agent channel ended without our close."""
        if self.rig is None or self.stopping:
            return
        self._on_failed(host, f"{why} (its agent is gone; its server part is ended with it)")

    # ------------------------------------------------------------------ stop
    def stop_parts(self, exclude: str | None = None) -> list[int]:
        """Stop every host's server part (but ``exclude``'s, a host label) through its
        agent (SIGTERM, the grace, SIGKILL to its group); the pids still alive after, of
        all hosts."""
        rig = self.rig
        if rig is None:
            return []
        grace = self.grace

        async def all_() -> list[Any]:
            return await asyncio.gather(*(link.stop(grace) for link in rig.links
                                          if not link.closed and link.host.label() != exclude),
                                        return_exceptions=True)
        try:
            results = rig.call(all_(), grace + 60.0)
        except Exception:
            log.exception("could not stop the rig's server parts")
            return []
        left: list[int] = []
        for r in results:
            if isinstance(r, list):
                left += r
            elif isinstance(r, BaseException):
                log.warning("a host's server part did not stop cleanly: %s", r)
        return left

    def close(self, timeout: float = 60.0) -> list[int]:
        """End every host's server part and close the agents (idempotent); the pids left
        alive. :meth:`status` keeps how each host ended."""
        rig = self.rig
        left: list[int] = []
        if rig is None:
            return left
        self.stopping = True
        try:
            left = self.stop_parts()
        finally:
            try:
                rig.close(timeout)
            except Exception:
                log.exception("could not close the rig")
            self._last = self.status()  # the view keeps how each host ended
            self.rig = None
        return left

    def stop(self) -> list[int]:
        """:meth:`close` (a :class:`ServerHandle`)."""
        return self.close()

    # ------------------------------------------------------------------ what it is
    def status(self) -> list[dict[str, Any]]:
        """The hosts, one plain dict each in the profile's order (once closed: as they
        were then). Safe from any thread: it only reads what the rig's thread writes (each
        link's hello, states, offset, ``lost``). Keys: ``host`` (its label, the SSH
        destination), ``role`` (``head``/``headless``, a Ray node ``ray-worker``; ``""``
        before the plan), ``rank`` (node rank or first DP rank, app.hosts.plan; None before
        the plan), ``state`` (``connecting`` until its agent's hello, ``starting`` until its
        part's first state message — the head's server part on a host with two parts — then
        that message's: ``loading``/``ready``/``failed``/``stopped``…; ``lost`` when its
        agent's channel ended without our close), ``reason`` (why it failed or was lost;
        ``""``), a headless part or Ray node counts as ready once the head is (it reports
        no readiness itself); ``hostname``, ``cards`` (the hello's NVML card names; ``[]``:
        none, the CPU build), ``offset_s``/``bound_s``/``rtt_s`` (its clock − the session's,
        the bound and the round trip of the exchange used, s,
        app.hosts.protocol.ClockOffset; None before measured), ``drift_ppm`` (None before
        two offsets 1 s apart)."""
        rig = self.rig
        if rig is None:
            return [dict(r) for r in self._last]
        plan = {c.host.label(): c for c in list(self.plan)}
        links = {link.host.label(): link for link in list(rig.links)}
        rows: list[dict[str, Any]] = []
        for host in rig.hosts:
            h = host.label()
            link, cmd = links.get(h), plan.get(h)
            row: dict[str, Any] = {"host": h, "role": cmd.role if cmd else "", "rank": cmd.rank if cmd else None,
                                   "state": "connecting", "reason": "", "hostname": "", "cards": [],
                                   "offset_s": None, "bound_s": None, "rtt_s": None, "drift_ppm": None}
            if link is not None:
                part = cmd.part if cmd else "server"
                hello, off = link.hello, link.offset
                states = [s for s in list(link.states) if s.get("part", "server") == part]
                last = states[-1] if states else {}
                row.update(hostname=str(hello.get("hostname") or ""),
                           cards=[str(c.get("name") or "GPU") for c in hello.get("cards") or []],
                           state=str(last.get("state") or "starting"),
                           reason=str(last.get("reason") or "") if last.get("state") == "failed" else "",
                           drift_ppm=link.drift_ppm)
                if off is not None:
                    row.update(offset_s=off.offset_s, bound_s=off.bound_s, rtt_s=off.rtt_s)
                if link.lost:
                    row.update(state="lost", reason=link.lost)
            rows.append(row)
        # a headless part has no API server of its own to answer: its agent reports it
        # loading until it ends. The head's is ready only once every rank joined (DP: the
        # engines' handshake, vllm/v1/engine/utils.py wait_for_engine_startup, vLLM 0.32.0;
        # PP: the world's torch.distributed init), so with the head ready so are they.
        if any(r["role"] == "head" and r["state"] == "ready" for r in rows):
            for r in rows:
                if r["role"] in ("headless", "ray-worker") and r["state"] == "loading":
                    r["state"] = "ready"
        return rows

    def hardware(self, engine: Engine, sim_info: dict[str, Any]) -> HardwareFingerprint | None:
        """The rig's fingerprint (app.run.hardware.rig_hardware): its hosts' cards from
        their agents' hellos (the sim's from the head's ``/sim/info``, ``sim_info``), the
        head's vLLM version from its probe; None once closed."""
        rig = self.rig
        if rig is None:
            return None
        hellos = {link.host.label(): link.hello for link in list(rig.links)}
        head = (self.probes[0].get("vllm") or {}) if self.probes else {}
        version = head.get("version") if engine.runs_vllm else None
        return rig_hardware(engine, rig.hosts, [hellos.get(h.label()) or {} for h in rig.hosts], info=sim_info,
                            vllm_version=version)

    def part_records(self) -> list[dict[str, Any]]:
        """Each host's part as a run records it: ``host``, ``role``, ``rank``, ``server``
        (its config's JSON), ``argv`` (what its agent ran) and ``defaults`` (the CPU build's
        defaults it filled in; None: none)."""
        return [{"host": c.host.label(), "role": c.role, "rank": c.rank,
                 "server": c.config.model_dump(mode="json"),
                 "argv": (self.parts.get(part_key(c)) or {}).get("argv") or [],
                 "defaults": (self.parts.get(part_key(c)) or {}).get("defaults")}
                for c in self.plan]
