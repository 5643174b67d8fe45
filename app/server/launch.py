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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(host: str, port: int) -> None:
    """Raise LaunchError naming the port when something already listens on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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
