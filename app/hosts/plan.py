"""Launch plans for a rig of several hosts (issue 21, item 3): the multiprocessing
(``mp``) backend's ``vllm serve`` command each host runs (:func:`mp_plan`), or the Ray
backend's cluster and server (:func:`ray_plan`); :func:`launch_plan` picks by the
config's ``distributed_executor_backend``. Shown and exported
(``vllm-dyno hosts plan``), and launched by the run controller through each host's agent
(app.run.handles ``RigHandle.launch``). Each part gets ``VLLM_HOST_IP`` (its
host's address) and, where the probe found it, ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``;
``--api-server-count`` stays on the head.

Two layouts, as vLLM's own argument handling defines them (vLLM 0.32.0,
``vllm/engine/arg_utils.py`` ``EngineArgs.add_cli_args`` and
``create_engine_config``, ``vllm/entrypoints/cli/serve.py`` ``run_headless``):

- **One replica across hosts** (TP × PP larger than a host; data_parallel_size 1):
  every host runs ``vllm serve`` with ``--nnodes N --node-rank R --master-addr HEAD
  --master-port P`` and ``--distributed-executor-backend mp``; the ranks other than 0 add
  ``--headless`` (no API server; ``run_headless`` starts the multiproc executor's workers
  that join the head's torch.distributed group at ``master_addr:master_port``). vLLM
  requires the world size (TP × PP × DP) to be divisible by ``--nnodes`` and each node
  holds world ÷ nnodes ranks, in rank order (TP innermost, so a TP group stays within a
  host when TP ≤ ranks per host; PP stages go across hosts).
- **Data-parallel replicas across hosts** (data_parallel_size D > 1, each replica
  within one host): the head runs the API server and ``--data-parallel-size D
  --data-parallel-size-local L --data-parallel-address HEAD --data-parallel-rpc-port P``;
  every other host runs the same with ``--headless --data-parallel-start-rank R`` (R =
  the replicas of the hosts before it), L replicas each (``-dpl``: "Number of data
  parallel replicas to run on this node", ``-dpr``: "Starting data parallel rank for
  secondary nodes", ``-dpa``/``-dpp``: the head's address and the RPC port, the same on
  every node).

The Ray backend (:func:`ray_plan`, ``--distributed-executor-backend ray``): vLLM's engine
joins a Ray cluster (``ray.init(address=…)``, ``RAY_ADDRESS`` when unset:
``initialize_ray_cluster``, vllm/v1/executor/ray_utils.py, 0.32.0) and places its
TP × PP workers on the cluster's GPUs as Ray actors; only the head runs ``vllm serve``.
The cluster is started the way vLLM's examples/online_serving/run_cluster.sh does: on
the head ``ray start --block --head --port P --node-ip-address ADDR``, on every other host
``ray start --block --address HEAD:P --node-ip-address ADDR`` (option names of
``ray start``: ray-project/ray python/ray/scripts/scripts.py, ``start``'s click options
``--head``, ``--port``, ``--address``, ``--node-ip-address``, ``--num-gpus``, ``--block``;
``--port`` is refused without ``--head`` there), each with ``VLLM_HOST_IP`` (run_cluster.sh
passes it per node). With ``ray_address`` (an existing cluster) no ``ray start`` is
planned: the head's ``vllm serve`` gets ``RAY_ADDRESS``. The CPU build cannot run it: its
platform has no Ray device key (``CpuPlatform.ray_device_key`` is ``""``, the default of
vllm/platforms/interface.py; ``initialize_ray_cluster`` raises "current platform cpu does
not support ray.", 0.32.0) — app.hosts.checks refuses such a plan before anything starts.

The option names are checked against the installed CPU build (0.32.0); the release that
first accepts each is the ``option_since`` table of app/planner/data/vllm_versions.yaml,
and app.hosts.checks.plan_findings refuses a plan a host's vLLM cannot run
(docs/vllm-facts.md, "Multi-node options by version").
"""
from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, replace

from app.config import ServerConfig
from app.hosts.spec import RAY_PORT, Host, parse_ray_address

#: ``--master-port`` default of vLLM (vllm/config/parallel.py ``ParallelConfig.master_port``, 0.32.0)
MASTER_PORT = 29501
#: the RPC port the plan gives data-parallel engines (vLLM picks a free one when unset on
#: one node; across nodes every node must name the same, so the plan fixes one)
DP_RPC_PORT = 13345


class PlanError(ValueError):
    """A layout that cannot be launched on these hosts; the message says why and what fits."""


#: what ``ray start`` prints once its node is up and joined (``cli_logger.success("Ray runtime
#: started.")``, ``start`` in ray-project/ray python/ray/scripts/scripts.py): the run controller
#: launches the head's ``vllm serve`` once every node of a Ray plan said it
RAY_STARTED = "Ray runtime started."
#: the engine a part of a plan runs: ``serve`` (``vllm serve``, or the sim with the same
#: options) or ``ray`` (``ray start``; :attr:`HostCommand.args`)
KINDS = ("serve", "ray")


@dataclass(frozen=True)
class HostCommand:
    """One host's part: ``host``, ``role`` (``head`` runs the API server, ``headless``
    does not; a Ray cluster's nodes are ``ray-head`` and ``ray-worker``), ``rank`` (node
    rank or first DP rank; a Ray node's host index), ``config`` (the ServerConfig with the
    multi-node options in ``extra_args``; for ``kind`` ``ray`` the part's environment and
    cards), ``kind`` (:data:`KINDS`), ``args`` (``ray start``'s arguments, kind ``ray``)."""

    host: Host
    role: str
    rank: int
    config: ServerConfig
    kind: str = "serve"
    args: tuple[str, ...] = ()

    @property
    def part(self) -> str:
        """The agent's name for this part: ``server`` or ``ray`` (one of each per host)."""
        return "ray" if self.kind == "ray" else "server"

    def shell(self, program: str = "vllm") -> str:
        """The command line to run on the host (``CUDA_VISIBLE_DEVICES=… vllm serve …``, or
        ``VLLM_HOST_IP=… ray start …``); the head's ``vllm serve`` carries the profile's
        ``--port`` when it sets one (vLLM's default, 8000, otherwise), a headless part has
        no API server and no port."""
        if self.kind == "ray":
            pre = self.config.shell_env()
            return (pre + " " if pre else "") + shlex.join(["ray", *self.args])
        return self.config.shell_command(program, "serve", include_port=True)

    def title(self) -> str:
        """The comment line that heads this host's command: ``# DEST — head`` /
        ``# DEST — headless, rank R``."""
        return f"# {self.host.ssh} — {self.role}" + (f", rank {self.rank}" if self.role not in ("head", "ray-head") else "")

    def ssh_line(self, program: str = "vllm") -> str:
        """The same, as one ``ssh`` line run from here."""
        port = [] if self.host.port == 22 else ["-p", str(self.host.port)]
        dest = f"{self.host.user}@{self.host.hostname}" if self.host.user else self.host.hostname
        return shlex.join(["ssh", *port, dest, "--", self.shell(program)])


def _cards(h: Host) -> int | None:
    idx = h.gpu_indices()
    return None if idx is None else len(idx)


def mp_plan(hosts: list[Host], config: ServerConfig, *, master_port: int = MASTER_PORT,
            dp_rpc_port: int = DP_RPC_PORT, interfaces: dict[str, str | None] | None = None) -> list[HostCommand]:
    """Per-host commands for ``config`` (its TP, PP, DP) over ``hosts`` (the first is the
    head). ``interfaces``: destination → the interface NCCL and Gloo use there
    (app.hosts.checks.socket_interfaces), set as ``NCCL_SOCKET_IFNAME`` and
    ``GLOO_SOCKET_IFNAME`` in that host's environment. Raises :class:`PlanError` for a
    layout vLLM would refuse or that does not fit the hosts' cards (where ``gpus`` says
    how many)."""
    if len(hosts) < 2:
        raise PlanError("a multi-host plan needs at least two hosts (hosts: in the profile, or --hosts)")
    n = len(hosts)
    tp = config.tensor_parallel_size or 1
    pp = config.pipeline_parallel_size or 1
    dp = config.data_parallel_size or 1
    head = hosts[0]
    addr = head.reach
    out: list[HostCommand] = []
    if dp == 1:
        world = tp * pp
        if world % n:
            raise PlanError(f"tensor_parallel_size {tp} × pipeline_parallel_size {pp} = {world} ranks cannot be split "
                            f"evenly over {n} hosts (vLLM requires --nnodes to divide the world size); use "
                            f"pipeline_parallel_size {n} (one stage per host) or a multiple of it")
        local = world // n
        if tp > local and local > 0:
            note = f"a tensor-parallel group of {tp} would span hosts ({local} rank(s) per host)"
            raise PlanError(f"{note}: keep tensor_parallel_size ≤ {local} and put the hosts in the pipeline "
                            f"(pipeline_parallel_size {n})")
        _check_cards(hosts, local, "ranks")
        for r, h in enumerate(hosts):
            extra = ["--nnodes", str(n), "--node-rank", str(r), "--master-addr", addr, "--master-port",
                     str(master_port)] + (["--headless"] if r else [])
            out.append(_command(h, r, config, extra, head=(r == 0), backend="mp", interfaces=interfaces))
        return out
    if dp % n:
        raise PlanError(f"data_parallel_size {dp} replicas cannot be spread evenly over {n} hosts; use a multiple "
                        f"of {n}")
    local_dp = dp // n
    _check_cards(hosts, local_dp * tp * pp, "cards for its replicas")
    for i, h in enumerate(hosts):
        extra = ["--data-parallel-size-local", str(local_dp), "--data-parallel-address", addr,
                 "--data-parallel-rpc-port", str(dp_rpc_port)]
        if i:
            extra += ["--headless", "--data-parallel-start-rank", str(i * local_dp)]
        out.append(_command(h, i * local_dp, config, extra, head=(i == 0), backend=None, interfaces=interfaces))
    return out


def ray_plan(hosts: list[Host], config: ServerConfig, *, ray_port: int = RAY_PORT, ray_address: str | None = None,
             interfaces: dict[str, str | None] | None = None) -> list[HostCommand]:
    """The Ray backend's plan for ``config`` (its TP × PP: one replica over the cluster's
    GPUs) over ``hosts`` (the first is the head): ``ray start`` on every host (``ray-head``
    with ``--head --port ray_port``, then the ``ray-worker`` parts with ``--address
    HEAD:ray_port``; ``--node-ip-address`` the host's address, ``--num-gpus`` its selected
    cards where ``gpus`` says; the part's environment has ``CUDA_VISIBLE_DEVICES``,
    ``VLLM_HOST_IP`` and the NCCL/Gloo interface, which Ray's worker processes inherit),
    then the head's ``vllm serve … --distributed-executor-backend ray`` with
    ``RAY_ADDRESS=HEAD:ray_port``. ``ray_address`` (``HOST:PORT`` of a running cluster):
    no ``ray start`` at all, only the head's ``vllm serve`` with ``RAY_ADDRESS`` set to it.
    Raises :class:`PlanError`: fewer than two hosts, data-parallel replicas (the mp plan's
    layout), more ranks than the hosts' cards, a bad ``ray_address``."""
    if len(hosts) < 2:
        raise PlanError("a multi-host plan needs at least two hosts (hosts: in the profile, or --hosts)")
    dp = config.data_parallel_size or 1
    if dp > 1:
        raise PlanError(f"data_parallel_size {dp}: the Ray plan runs one replica (TP × PP) over the cluster; "
                        "spread data-parallel replicas over the hosts with the mp backend (drop "
                        "distributed_executor_backend: ray)")
    world = (config.tensor_parallel_size or 1) * (config.pipeline_parallel_size or 1)
    cards = [_cards(h) for h in hosts]
    if all(c is not None for c in cards) and world > sum(cards):  # type: ignore[arg-type]
        raise PlanError(f"tensor_parallel_size × pipeline_parallel_size = {world} workers, but the hosts have "
                        f"{sum(cards)} card(s) selected (gpus): Ray places one worker per card; lower the "
                        "sizes or select more cards")  # type: ignore[arg-type]
    head = hosts[0]
    if ray_address is not None:
        try:
            parse_ray_address(ray_address)
        except ValueError as e:
            raise PlanError(str(e)) from None
        address = ray_address.strip()
    else:
        address = f"{_bracketed(head.reach)}:{ray_port}"
    out: list[HostCommand] = []
    if ray_address is None:
        for i, h in enumerate(hosts):
            args = ["start", "--block"] + (["--head", "--port", str(ray_port)] if i == 0 else ["--address", address])
            if is_ip(h.reach):
                args += ["--node-ip-address", h.reach]
            if _cards(h) is not None:
                args += ["--num-gpus", str(_cards(h))]
            env = _part_env(h, ServerConfig(model=config.model, env=dict(config.env)), interfaces)
            part = ServerConfig(model=config.model, gpus=h.gpu_indices(), env=env)
            out.append(HostCommand(h, "ray-head" if i == 0 else "ray-worker", i, part, kind="ray", args=tuple(args)))
    serve = _command(head, 0, config.model_copy(update={"env": {**config.env, "RAY_ADDRESS": address}}), [],
                     head=True, backend="ray", interfaces=interfaces)
    out.append(replace(serve, config=serve.config.model_copy(update={"gpus": None})))  # Ray gives the workers cards
    return out


def launch_plan(hosts: list[Host], config: ServerConfig, *, ray_address: str | None = None,
                interfaces: dict[str, str | None] | None = None) -> list[HostCommand]:
    """The plan of ``config``'s backend: :func:`ray_plan` for
    ``distributed_executor_backend`` ``ray``, else :func:`mp_plan`. ``ray_address`` (an
    existing Ray cluster) only with the Ray backend; raises :class:`PlanError`."""
    if config.distributed_executor_backend == "ray":
        return ray_plan(hosts, config, ray_address=ray_address, interfaces=interfaces)
    if ray_address:
        raise PlanError(f"ray_address {ray_address} names a Ray cluster, but the server's distributed_executor_"
                        f"backend is {config.distributed_executor_backend or 'mp (the default)'}: set "
                        "distributed_executor_backend: ray (--backend ray), or drop ray_address")
    return mp_plan(hosts, config, interfaces=interfaces)


def _bracketed(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def _check_cards(hosts: list[Host], need: int, what: str) -> None:
    for i, h in enumerate(hosts):
        have = _cards(h)
        if have is not None and have < need:
            raise PlanError(f"hosts[{i}] ({h.ssh}) has {have} card(s) selected (gpus) but this layout puts {need} "
                            f"{what} on each host")


def is_ip(text: str) -> bool:
    """``text`` is an IP address (IPv6 in brackets or not), not a name."""
    try:
        ipaddress.ip_address(text.strip("[]"))
        return True
    except ValueError:
        return False


def _head_only(args: list[str]) -> list[str]:
    """``args`` without ``--api-server-count N``: vLLM refuses it with ``--headless``
    ("--api-server-count=N cannot be used with --headless", vllm/entrypoints/cli/serve.py,
    0.32.0), and only the head runs API servers."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--api-server-count":
            skip = True
        elif not a.startswith("--api-server-count="):
            out.append(a)
    return out


def _command(h: Host, rank: int, config: ServerConfig, extra: list[str], *, head: bool,
             backend: str | None, interfaces: dict[str, str | None] | None) -> HostCommand:
    own = list(config.extra_args) if head else _head_only(list(config.extra_args))
    upd: dict = {"gpus": h.gpu_indices(), "extra_args": own + extra}
    env = _part_env(h, config, interfaces)
    if env != config.env:
        upd["env"] = env
    if backend:
        upd["distributed_executor_backend"] = backend
    if head:
        upd["host"] = h.reach if config.host in ("127.0.0.1", "localhost") else config.host
    else:
        upd["port"] = None  # no API server on a headless node
    return HostCommand(h, "head" if head else "headless", rank, config.model_copy(update=upd))


def _part_env(h: Host, config: ServerConfig, interfaces: dict[str, str | None] | None) -> dict[str, str]:
    """``config.env`` with the host's NCCL/Gloo interface and ``VLLM_HOST_IP``."""
    env = dict(config.env)
    name = (interfaces or {}).get(h.label())
    if name:  # NCCL's and Gloo's socket interface (app.hosts.checks)
        env.update(NCCL_SOCKET_IFNAME=name, GLOO_SOCKET_IFNAME=name)
    if is_ip(h.reach) and "VLLM_HOST_IP" not in env:
        # the address vLLM gives the other nodes for this node's queues: else its outbound
        # address (a UDP connect to 8.8.8.8), 0.0.0.0 without a route (get_ip,
        # vllm/utils/network_utils.py; used as mq_connect_ip, vllm/v1/executor/multiproc_executor.py,
        # and by the Ray workers, vllm/v1/executor/ray_utils.py get_node_ip, 0.32.0)
        env["VLLM_HOST_IP"] = h.reach
    return env


def render(plan: list[HostCommand], program: str = "vllm") -> str:
    """The plan as text: one block per host, its role and its command."""
    lines = []
    for c in plan:
        lines += [c.title(), c.shell(program)]
    return "\n".join(lines)


def script(plan: list[HostCommand], program: str = "vllm") -> str:
    """The plan as a shell script (the window's Export…; ``vllm-dyno hosts plan --ssh``
    prints the same lines): each host's :meth:`HostCommand.ssh_line` under its
    :meth:`HostCommand.title`, run in the background in plan order (the head first: the
    others join it), then ``wait``. Ctrl-C or the script's end ends the ssh clients; an
    ssh session without a terminal does not always end its remote command with it, so
    the comment says how to stop a part that outlives it."""
    lines = ["#!/usr/bin/env bash",
             f"# vLLM over {len(plan)} hosts, {'Ray' if any(c.kind == 'ray' for c in plan) else 'multiprocessing'} "
             "backend: one ssh line per part, the head first",
             "# (written by vLLM Dyno, app.hosts.plan; the same as `vllm-dyno hosts plan --ssh`).",
             "# A launch from the app also sets NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the interface that",
             "# holds each host's address, found by its agent. A part that outlives this script: end it there",
             "# (pkill -f 'vllm serve').",
             "trap 'kill $(jobs -p) 2>/dev/null' INT TERM EXIT"]
    for c in plan:
        lines += [c.title(), c.ssh_line(program) + " &"]
    lines.append("wait")
    return "\n".join(lines) + "\n"
