"""What a launch starts: :class:`LaunchTarget`, and its one builder, :func:`launch_target`.

Every front end — the window, ``vllm-dyno run``/``serve``/``ramp`` and the tuner — makes
its target through :func:`launch_target`, so that a field (the sim rig's options, the
profile's hosts and Ray address, an attached server's config) is derived one way;
``tests/unit/test_launch_target.py`` fails on a ``LaunchTarget(...)`` built elsewhere in
``app/``, ``widgets/`` or ``benchmarks/``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from app.config import ServerConfig
from app.engines import Engine
from app.hosts.link import SshOptions
from app.hosts.spec import Host
from app.planner.launch_defaults import LaunchDefaults, cpu_build_defaults
from app.profiles.model import Profile
from app.server.interpreter import inspect_interpreter, resolve_python

log = logging.getLogger(__name__)


@dataclass
class LaunchTarget:
    """What to start. ``engine``: an :class:`app.engines.Engine` — ``vllm``, ``sim`` or
    ``attach`` (a name is taken as its engine). ``sim_args``: the sim rig's options
    (``--sim-gpu …``, ``SimRig.argv()``). ``python``: the vLLM interpreter (None →
    app.server.interpreter.resolve_python). ``attach_url``/``attach_model``: the server to
    attach to. ``use_nvml``: sample this machine's cards (not for the sim, nor the CPU
    build). Intervals in seconds between samples; ``startup_timeout`` and ``grace``
    (SIGTERM → SIGKILL) in seconds, ``grace`` None = the engine's
    (``Engine.spec.stop_grace_s``: 10 s for the sim, 20 s for vLLM). ``expose``: the user
    confirmed a ``config.host`` beyond loopback (``--expose``, the window's dialog);
    without it such a launch is refused (issue 15, item 4).
    ``fill_defaults``: the CPU build's working defaults are still to be filled in for
    what the user did not set (:meth:`RunController.launch_defaults`; False once done; a
    rig's are filled in by each host's agent for its own interpreter and cores).
    ``hosts``: the profile's rig (two or more: a multi-host launch through the hosts'
    agents, :class:`app.run.handles.RigHandle`); ``ssh``: how they are reached (None: the
    user's SSH agent, config and known hosts); ``rig_timeout``: seconds to open every
    host's agent and probe it, and for the Ray backend's cluster to come up;
    ``ray_address``: a running Ray cluster (``HOST:PORT``) the Ray backend attaches to
    instead of starting one on the hosts (the profile's ``ray_address``)."""

    engine: Engine
    config: ServerConfig
    sim_args: list[str] = field(default_factory=list)
    python: str | None = None
    attach_url: str | None = None
    attach_model: str | None = None
    use_nvml: bool = True
    telemetry: bool = True
    gpu_interval: float = 0.25
    metrics_interval: float = 0.5
    startup_timeout: float = 900.0
    grace: float | None = None
    expose: bool = False
    fill_defaults: bool = True
    hosts: list[Host] = field(default_factory=list)
    ssh: SshOptions | None = None
    rig_timeout: float = 180.0
    ray_address: str | None = None

    def __post_init__(self) -> None:
        self.engine = Engine(self.engine)

    @property
    def multi_host(self) -> bool:
        """A launch over two or more hosts (their agents), not one local server."""
        return self.engine.launches and len(self.hosts) >= 2

    @classmethod
    def from_profile(cls, profile: Profile, **kw: Any) -> "LaunchTarget":
        """The target of a profile (:func:`launch_target` with ``profile``): its engine,
        server config, sim rig or attach URL, hosts and Ray address; ``kw`` sets the other
        fields."""
        return launch_target(profile=profile, **kw)


def launch_target(engine: Engine | str | None = None, config: ServerConfig | None = None, *,
                  profile: Profile | None = None, **fields: Any) -> LaunchTarget:
    """The one way to make a :class:`LaunchTarget`.

    ``engine`` and ``config``: what to start (a name is taken as its engine). With
    ``profile`` (and no ``engine``/``config``): the profile's engine, its server config
    (:meth:`Profile.server_config`), its sim rig's options (``profile.sim.argv()`` for a
    simulated engine), its attach URL, its hosts and Ray address. An attached server
    without a ``config`` gets ``ServerConfig(model=attach_model or "attached")`` (the
    served model is the first one ``/v1/models`` lists: the load generator asks).
    ``fields``: the other :class:`LaunchTarget` fields (seconds for the intervals and
    timeouts), which override what the profile gives. Raises ValueError without an
    engine (neither ``engine`` nor ``profile``) or without a config for an engine that
    launches."""
    kw: dict[str, Any] = {}
    if profile is not None:
        engine = profile.engine if engine is None else engine
        if config is None:
            config = profile.server_config()
        kw.update(sim_args=profile.sim.argv() if profile.engine.simulated and profile.sim else [],
                  attach_url=profile.attach_url, hosts=list(profile.hosts), ray_address=profile.ray_address)
    if engine is None:
        raise ValueError("a launch target needs an engine (or a profile)")
    eng = Engine(engine)
    kw.update(fields)
    if config is None:
        if eng.launches:
            raise ValueError(f"a launch target of engine {eng.value} needs a server config")
        config = ServerConfig(model=kw.get("attach_model") or "attached")
    for name in ("sim_args", "hosts"):  # the caller's list is not shared with the target
        if kw.get(name) is not None:
            kw[name] = list(kw[name])
    return LaunchTarget(engine=eng, config=config, **kw)


def with_cpu_defaults(target: LaunchTarget) -> tuple[LaunchTarget, LaunchDefaults | None]:
    """``target`` with the CPU build's working defaults filled in where the user set
    nothing (:func:`app.planner.launch_defaults.cpu_build_defaults`: a KV cache size, the
    in-process executor), for engine ``vllm`` on an interpreter with the CPU build, and
    what was chosen (None: nothing looked at). Once per target: the result has
    ``fill_defaults`` False; a rig's are filled in by each host's agent. Blocking
    (interpreter probe, planner). Never raises: when the interpreter cannot be probed the
    target is left as it is and the launch reports why."""
    if not target.engine.runs_vllm or not target.fill_defaults or target.multi_host:
        return target, None  # a rig's interpreters are on its hosts: each agent fills in its own
    done = replace(target, fill_defaults=False)
    try:
        interp = inspect_interpreter(resolve_python(target.python))
    except Exception:  # InterpreterError, or no interpreter at all: the launch says so
        return done, None
    if not interp.is_cpu_build:
        return done, None
    try:
        d = cpu_build_defaults(target.config, vllm_version=interp.version)
    except Exception:  # defaults are a help: a failure here must not stop the launch
        log.exception("could not work out the CPU build's defaults")
        return done, None
    return replace(done, config=d.config), d
