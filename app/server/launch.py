"""Pre-launch checks and the command that starts a server (vLLM or the sim).

Every check raises :class:`LaunchError` with a message that names the input and the
fix, before any process is started (issue #2, "Bad input").
"""
from __future__ import annotations

import errno
import os
import socket

from app.config import ConfigError, ServerConfig, check_model_path
from app.engines import SERVABLE, Engine, Launch, names
from app.helper_process import helper_argv
from app.server.interpreter import (InterpreterError, VllmInterpreter, inspect_interpreter, metadata_shim,
                                    needs_serve_form, ray_interpreter, resolve_python)


class LaunchError(RuntimeError):
    """The server cannot be launched as configured; the message says why and how to fix it."""


def _family(host: str) -> int:
    """The address family of ``host``: AF_INET6 for an IPv6 address (``::``, ``::1``),
    AF_INET otherwise (names are resolved by getaddrinfo). Raises LaunchError for a host
    that does not resolve."""
    try:
        infos = socket.getaddrinfo(host or "127.0.0.1", None, type=socket.SOCK_STREAM)
    except OSError as e:
        raise LaunchError(f"host {host!r} does not resolve ({e}): give an address such as 127.0.0.1") from None
    fams = [i[0] for i in infos]
    return socket.AF_INET if socket.AF_INET in fams else fams[0]


class PortReservation:
    """A TCP port held for a server until the server listens on it (issue 15, item 6).

    The socket is bound without ``SO_REUSEADDR`` — so the bind fails while anything else
    holds the port, listening or merely bound, and a second launch on the same port
    (another vLLM Dyno, or this one twice) is refused at once — and the flag is set on it
    after the bind: vLLM binds its port with ``SO_REUSEADDR`` before it loads the model
    (vllm/entrypoints/launchers/launcher.py ``create_server_socket``, 0.32; the sim's
    aiohttp site likewise), which Linux allows next to a bound socket that has the flag
    and does not listen, and it may listen on it later for the same reason. Close it
    once the server is ready (or gone)."""

    def __init__(self, host: str, port: int | None) -> None:
        self.host = host
        fam = _family(host)
        s = socket.socket(fam, socket.SOCK_STREAM)
        try:
            s.bind((host, port or 0))
        except OSError as e:
            s.close()
            if port and e.errno in (errno.EADDRINUSE, errno.EACCES):
                # deferred: psutil is only needed to name who holds a busy port
                from app.server.procs import port_holder

                holder = port_holder(port) if e.errno == errno.EADDRINUSE else "(a port below 1024 needs root)"
                raise LaunchError(
                    f"port {port} on {host} is already in use by {holder}: choose another --port, or leave it "
                    "unset to let vLLM Dyno pick a free one") from None
            raise LaunchError(f"cannot bind {host}:{port or 0}: {e}; give an address of this machine, "
                              "e.g. 127.0.0.1") from None
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port: int = s.getsockname()[1]
        self._sock: socket.socket | None = s

    def close(self) -> None:
        """Release the port (idempotent)."""
        s, self._sock = self._sock, None
        if s is not None:
            s.close()

    @property
    def held(self) -> bool:
        return self._sock is not None

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it); IPv4 or IPv6 as
    the host is. Raises LaunchError when ``host`` cannot be bound at all. A launch holds
    its port instead (:class:`PortReservation`)."""
    with PortReservation(host, None) as r:
        return r.port


def check_port(host: str, port: int) -> None:
    """Raise LaunchError naming the port and the process holding it when ``port`` is taken
    (listened on, or bound by a server still loading)."""
    PortReservation(host, port).close()


def prepare(
    config: ServerConfig, engine: Engine | str = Engine.VLLM, python: str | None = None,
    sim_args: list[str] | None = None
) -> tuple[ServerConfig, list[str], dict[str, str], VllmInterpreter | None, PortReservation]:
    """Validate and build ``(config_with_port, argv, extra_env, interpreter, reservation)``.

    ``engine`` (an :class:`app.engines.Engine` or its name), by how it launches
    (``engine.spec.launch``): ``vllm`` (needs an interpreter with vLLM), ``sim`` (runs
    ``app.sim.server`` with the same options plus ``sim_args``) or ``ray`` (a host's Ray
    node of a multi-host launch, app.hosts.plan.ray_plan: ``ray`` with ``sim_args`` — e.g.
    ``start --block --head …`` — run by the vLLM interpreter as ``python -m
    ray.scripts.scripts``, the module of Ray's ``ray`` entry point, ray-project/ray
    python/ray/scripts/scripts.py; the interpreter needs Ray, not vLLM; the config gives only
    its environment and cards). ``extra_env``: only
    what the server gets on top of the app's own environment (``config.env``,
    ``CUDA_VISIBLE_DEVICES`` …); it is handed to the reaper as data, which applies it to
    the server alone (app.server.reaper, issue 15 item 1). ``reservation``: the server's
    port, held (:class:`PortReservation`) until the caller closes it — when the server
    listens, or on any failure (this function closes it when it raises). Raises
    LaunchError.
    """
    known = Engine.parse(engine)
    if known is None:
        raise LaunchError(_cannot_launch(engine))
    engine = known
    interp = None
    ray_python = None
    if engine.spec.launch is Launch.VLLM_SERVER:
        try:
            check_model_path(config)
        except ConfigError as e:
            raise LaunchError(str(e)) from e

        try:
            interp = inspect_interpreter(resolve_python(python))
        except InterpreterError as e:
            raise LaunchError(str(e)) from e
    elif engine.spec.launch is Launch.RAY_NODE:  # a Ray node needs Ray in its interpreter (vLLM: only where it serves)
        try:
            ray_python = ray_interpreter(resolve_python(python))[0]
        except InterpreterError as e:
            raise LaunchError(str(e)) from e
    reservation = PortReservation(config.host, config.port)
    try:
        return _prepared(config.model_copy(update={"port": reservation.port}), engine, interp, sim_args,
                         ray_python) + (reservation,)
    except BaseException:
        reservation.close()
        raise


def _prepared(config: ServerConfig, engine: Engine, interp: VllmInterpreter | None, sim_args: list[str] | None,
              ray_python: str | None = None) -> tuple[ServerConfig, list[str], dict[str, str], VllmInterpreter | None]:
    # what the server's environment differs in from the app's
    env = {k: v for k, v in config.to_environ().items() if os.environ.get(k) != v}

    def default(k: str, v: str) -> None:
        if k not in env and k not in os.environ:
            env[k] = v

    launch = engine.spec.launch
    if launch is Launch.VLLM_SERVER:
        assert interp is not None
        form = interp.launch_form
        if form == "api_server" and needs_serve_form(config.extra_args):
            # a multi-node part (--headless …) needs `vllm serve`; the CPU build runs it with
            # the package-metadata shim first on PYTHONPATH (docs/vllm-facts.md, "Multi-node")
            try:
                shim = metadata_shim(interp)
            except OSError as e:
                raise LaunchError(f"cannot write the vllm metadata shim for `vllm serve` on the CPU build: {e}; "
                                  "make the vllm-dyno data folder writable (VLLM_DYNO_HOME)") from None
            path = config.to_environ().get("PYTHONPATH")
            env["PYTHONPATH"] = shim + (os.pathsep + path if path else "")
            form = "serve"
        argv = config.to_argv(interp.python, form)  # type: ignore[arg-type]
        if config.model_is_local:
            default("HF_HUB_OFFLINE", "1")
        default("PYTHONUNBUFFERED", "1")
    elif launch is Launch.RAY_NODE:
        assert ray_python is not None
        argv = [ray_python, "-m", "ray.scripts.scripts", *(sim_args or [])]
        default("PYTHONUNBUFFERED", "1")
    elif launch is Launch.SIM_SERVER:
        argv = helper_argv("app.sim.server") + ["--model", config.model] + config.option_argv() + list(sim_args or [])
        default("PYTHONUNBUFFERED", "1")
    else:
        raise LaunchError(_cannot_launch(engine))
    return config, argv, env, interp


def _cannot_launch(engine: object) -> str:
    name = engine.value if isinstance(engine, Engine) else engine
    return (f"engine {name!r} cannot be launched: use {names(SERVABLE)} ('attach' launches nothing; 'ray' is a "
            "host's Ray node of a multi-host launch)")
