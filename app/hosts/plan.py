"""Launch plans for a rig of several hosts, multiprocessing (``mp``) backend (issue 21,
item 3, first part): the ``vllm serve`` command each host runs. Shown and exported
(``vllm-dyno hosts plan``), and launched by the run controller through each host's agent
(app.run.controller ``RunController._launch_rig``). Each part gets ``VLLM_HOST_IP`` (its
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

The option names are checked against the installed CPU build (0.32.0); the release that
first accepts each is the ``option_since`` table of app/planner/data/vllm_versions.yaml,
and app.hosts.checks.plan_findings refuses a plan a host's vLLM cannot run
(docs/vllm-facts.md, "Multi-node options by version").
"""
from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass

from app.config import ServerConfig
from app.hosts.spec import Host

#: ``--master-port`` default of vLLM (vllm/config/parallel.py ``ParallelConfig.master_port``, 0.32.0)
MASTER_PORT = 29501
#: the RPC port the plan gives data-parallel engines (vLLM picks a free one when unset on
#: one node; across nodes every node must name the same, so the plan fixes one)
DP_RPC_PORT = 13345


class PlanError(ValueError):
    """A layout that cannot be launched on these hosts; the message says why and what fits."""


@dataclass(frozen=True)
class HostCommand:
    """One host's part: ``host``, ``role`` (``head`` runs the API server, ``headless``
    does not), ``rank`` (node rank or first DP rank), ``config`` (the ServerConfig with
    the multi-node options in ``extra_args``)."""

    host: Host
    role: str
    rank: int
    config: ServerConfig

    def shell(self, program: str = "vllm") -> str:
        """The command line to run on the host (``CUDA_VISIBLE_DEVICES=… vllm serve …``)."""
        return self.config.shell_command(program, "serve")

    def title(self) -> str:
        """The comment line that heads this host's command: ``# DEST — head`` /
        ``# DEST — headless, rank R``."""
        return f"# {self.host.ssh} — {self.role}" + (f", rank {self.rank}" if self.role != "head" else "")

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
    env = dict(config.env)
    name = (interfaces or {}).get(h.label())
    if name:  # NCCL's and Gloo's socket interface (app.hosts.checks)
        env.update(NCCL_SOCKET_IFNAME=name, GLOO_SOCKET_IFNAME=name)
    if is_ip(h.reach) and "VLLM_HOST_IP" not in env:
        # the address vLLM gives the other nodes for this node's queues: else its outbound
        # address (a UDP connect to 8.8.8.8), 0.0.0.0 without a route (get_ip,
        # vllm/utils/network_utils.py; used as mq_connect_ip, vllm/v1/executor/multiproc_executor.py, 0.32.0)
        env["VLLM_HOST_IP"] = h.reach
    if env != config.env:
        upd["env"] = env
    if backend:
        upd["distributed_executor_backend"] = backend
    if head:
        upd["host"] = h.reach if config.host in ("127.0.0.1", "localhost") else config.host
    else:
        upd["port"] = None  # no API server on a headless node
    return HostCommand(h, "head" if head else "headless", rank, config.model_copy(update=upd))


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
             f"# vLLM over {len(plan)} hosts, multiprocessing backend: one ssh line per host, the head first",
             "# (written by vLLM Dyno, app.hosts.plan; the same as `vllm-dyno hosts plan --ssh`).",
             "# A launch from the app also sets NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the interface that",
             "# holds each host's address, found by its agent. A part that outlives this script: end it there",
             "# (pkill -f 'vllm serve').",
             "trap 'kill $(jobs -p) 2>/dev/null' INT TERM EXIT"]
    for c in plan:
        lines += [c.title(), c.ssh_line(program) + " &"]
    lines.append("wait")
    return "\n".join(lines) + "\n"
