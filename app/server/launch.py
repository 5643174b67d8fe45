"""Pre-launch checks and the command that starts a server (vLLM or the sim).

Every check raises :class:`LaunchError` with a message that names the input and the
fix, before any process is started (issue #2, "Bad input").
"""
from __future__ import annotations

import errno
import os
import socket

from app.config import ConfigError, ServerConfig, check_model_path
from app.helper_process import helper_argv
from app.server.interpreter import InterpreterError, VllmInterpreter, inspect_interpreter, resolve_python


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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it); IPv4 or IPv6 as
    the host is. Raises LaunchError when ``host`` cannot be bound at all."""
    try:
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    except OSError as e:
        raise LaunchError(f"cannot bind {host}: {e}; give an address of this machine, e.g. 127.0.0.1") from None


def check_port(host: str, port: int) -> None:
    """Raise LaunchError naming the port when something already listens on it."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                raise LaunchError(
                    f"port {port} on {host} is already in use (or not allowed): choose "
                    "another --port, or leave it unset to let vLLM Dyno pick a free one"
                ) from e
            raise LaunchError(f"cannot bind {host}:{port}: {e}") from e


def prepare(
    config: ServerConfig, engine: str = "vllm", python: str | None = None, sim_args: list[str] | None = None
) -> tuple[ServerConfig, list[str], dict[str, str], VllmInterpreter | None]:
    """Validate and build ``(config_with_port, argv, extra_env, interpreter)``.

    ``engine``: ``vllm`` (needs an interpreter with vLLM) or ``sim`` (runs
    ``app.sim.server`` with the same options plus ``sim_args``). ``extra_env``: only
    what the server gets on top of the app's own environment (``config.env``,
    ``CUDA_VISIBLE_DEVICES`` …); it is handed to the reaper as data, which applies it to
    the server alone (app.server.reaper, issue 15 item 1). Raises LaunchError.
    """
    interp = None
    if engine == "vllm":
        try:
            check_model_path(config)
        except ConfigError as e:
            raise LaunchError(str(e)) from e

        try:
            interp = inspect_interpreter(resolve_python(python))
        except InterpreterError as e:
            raise LaunchError(str(e)) from e
    if config.port is None:
        config = config.model_copy(update={"port": free_port(config.host)})
    else:
        check_port(config.host, config.port)
    # what the server's environment differs in from the app's
    env = {k: v for k, v in config.to_environ().items() if os.environ.get(k) != v}

    def default(k: str, v: str) -> None:
        if k not in env and k not in os.environ:
            env[k] = v

    if engine == "vllm":
        assert interp is not None
        argv = config.to_argv(interp.python, interp.launch_form)  # type: ignore[arg-type]
        if config.model_is_local:
            default("HF_HUB_OFFLINE", "1")
        default("PYTHONUNBUFFERED", "1")
    elif engine == "sim":
        argv = helper_argv("app.sim.server") + ["--model", config.model] + config.option_argv() + list(sim_args or [])
        default("PYTHONUNBUFFERED", "1")
    else:
        raise LaunchError(f"engine {engine!r} cannot be launched: use 'vllm' or 'sim' ('attach' launches nothing)")
    return config, argv, env, interp
