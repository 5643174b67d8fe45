"""``vllm-dyno agent`` and ``vllm-dyno hosts check``: the hosts of a rig (issue 21).

``agent`` is what the app starts on each host over SSH: it speaks the line protocol of
app.hosts.protocol on its stdin/stdout (not for people). ``hosts plan DEST … --model M`` prints
the per-host commands of a layout (app.hosts.plan): ``vllm serve`` per host (``--backend
mp``), or the Ray cluster's ``ray start`` per host and the head's ``vllm serve``
(``--backend ray``; ``--ray-address HOST:PORT``: a running cluster, no ``ray start``).
``hosts check DEST …`` starts
the agent on each destination (``user@host[:port]``, or ``localhost``) the way a launch
will, and prints what it reports: version, cards or CPU cores, the clock offset with its
bound and the round trip, its vLLM, ``/dev/shm`` and interface; ``--seconds N`` also
watches its telemetry for N seconds. With several hosts it checks that they can run one
server together (app.hosts.checks; ``--model`` a path that must be on each), and with a
layout (the options of ``hosts plan``) checks that layout's plan on them too; exit 1 when
they cannot.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from app.cli.common import add_ssh_options, err, index_list, number_type, positive_seconds, ssh_options
from app.hosts.spec import Host, hosts_from, parse_ray_address


count = number_type(int, low=1, what="a whole number", example="2")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="the per-host agent the app starts over SSH (line-delimited JSON on stdin/stdout)")
    p.add_argument("--gpus", type=index_list, help="GPU indices this agent reports and samples (default: all)")
    p.set_defaults(func=cmd_agent)
    h = sub.add_parser("hosts", help="check the hosts of a rig: start the agent on each over SSH")
    hs = h.add_subparsers(dest="hosts_command", required=True)
    c = hs.add_parser("check", help="start the agent on each host and print its hello and clock offset")
    c.add_argument("destinations", nargs="+", metavar="DEST", help="user@host[:port] or localhost")
    c.add_argument("--dyno", default="vllm-dyno", help="the command that runs vllm-dyno on the hosts")
    add_ssh_options(c)  # --known-hosts, --identity, --ssh-config: the same as `run`'s
    c.add_argument("--seconds", type=positive_seconds, help="also watch each host's telemetry this long")
    c.add_argument("--python", help="the vLLM interpreter on the hosts (default: found there)")
    c.add_argument("--model", help="a model path that must exist on every host (checked there); with a layout "
                                   "option, the model of the layout")
    _layout_options(c, model=False)
    c.set_defaults(func=cmd_hosts_check)
    pl = hs.add_parser("plan", help="the per-host commands (mp: vllm serve each; ray: the Ray cluster and the "
                                    "head's vllm serve) for a layout over the hosts")
    pl.add_argument("destinations", nargs="+", metavar="DEST", help="user@host[:port]; the first is the head")
    pl.add_argument("--model", required=True, help="the model directory or Hugging Face id (the same on every host)")
    _layout_options(pl, model=True)
    pl.add_argument("--ssh", action="store_true", help="print each command as an ssh line run from here")
    pl.set_defaults(func=cmd_hosts_plan)


def ray_address(text: str) -> str:
    """``--ray-address``'s type: ``HOST:PORT`` (app.hosts.spec.parse_ray_address), checked
    as the option is read, before any host is contacted."""
    try:
        parse_ray_address(text, "--ray-address")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _layout_options(p: argparse.ArgumentParser, *, model: bool) -> None:
    """The layout of ``hosts plan`` (and ``hosts check``: there, given at all, it is planned and checked)."""
    p.add_argument("--tensor-parallel-size", type=count, help="TP: ranks per pipeline stage (default 1)")
    p.add_argument("--pipeline-parallel-size", type=count, help="PP: stages (across hosts; default 1)")
    p.add_argument("--data-parallel-size", type=count, help="DP: replicas (spread over the hosts; default 1)")
    p.add_argument("--gpus-per-host", type=count, help="cards to use on each host (the first N; default: all)")
    p.add_argument("--backend", choices=("mp", "ray"), help="vLLM's --distributed-executor-backend: mp (per-host "
                   "vllm serve, the default) or ray (a Ray cluster of the hosts, vllm serve on the head)")
    p.add_argument("--port", type=number_type(int, low=1, high=65535, what="a TCP port", example="8000"),
                   help="the head's API server port (default: vLLM's, 8000)")
    p.add_argument("--ray-address", type=ray_address, metavar="HOST:PORT", help="with --backend ray: a running Ray cluster to attach "
                   "to (no ray start on the hosts)")


def _layout_given(a: argparse.Namespace) -> bool:
    return any(getattr(a, k) is not None for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                                  "data_parallel_size", "gpus_per_host", "backend", "ray_address"))


def _layout_plan(a: argparse.Namespace, hosts: list[Host], interfaces: dict[str, str | None] | None = None):
    """The plan of the layout options over ``hosts`` (app.hosts.plan.launch_plan). Raises
    ValueError (a bad option, a layout that does not fit, naming it and the fix)."""
    # deferred: the plan's modules load only for the hosts commands
    from app.config import ServerConfig
    from app.hosts.plan import PlanError, launch_plan

    if not (a.model or "").strip():
        raise ValueError("--model is empty: give the model directory or Hugging Face id (the same path on every "
                         "host)")
    if a.ray_address and a.backend != "ray":
        raise ValueError(f"--ray-address {a.ray_address} is a Ray cluster for the Ray backend: add --backend ray, "
                         "or drop --ray-address")
    sizes = {"tensor_parallel_size": a.tensor_parallel_size, "pipeline_parallel_size": a.pipeline_parallel_size,
             "data_parallel_size": a.data_parallel_size}
    opts = {k: v for k, v in sizes.items() if v and v > 1}  # 1: vLLM's default
    if a.backend == "ray":
        opts["distributed_executor_backend"] = "ray"
    if a.port is not None:
        opts["port"] = a.port
    cfg = ServerConfig(model=a.model, **opts)
    if a.gpus_per_host:
        hosts = [h.model_copy(update={"gpus": a.gpus_per_host}) for h in hosts]
    try:
        return launch_plan(hosts, cfg, ray_address=a.ray_address, interfaces=interfaces)
    except PlanError as e:
        raise ValueError(f"the layout does not fit: {e}") from None


def cmd_hosts_plan(a: argparse.Namespace) -> int:
    # deferred: the plan's modules load only for this command
    from app.hosts.plan import render

    try:
        plan = _layout_plan(a, hosts_from(list(a.destinations)))
    except ValueError as e:
        return err(str(e))
    print("\n".join(c.ssh_line() for c in plan) if a.ssh else render(plan))
    return 0


def cmd_agent(a: argparse.Namespace) -> int:
    # deferred: the agent's modules (supervisor, samplers) load only for this command
    from app.hosts.agent import main

    return main(a.gpus)


def cmd_hosts_check(a: argparse.Namespace) -> int:
    try:
        hosts = hosts_from([{"ssh": d, "dyno": a.dyno, "python": a.python} for d in a.destinations])
        layout = _layout_given(a)
        if layout:
            if not a.model:
                raise ValueError("a layout to check needs its model: add --model (the model directory or Hugging "
                                 "Face id, the same on every host)")
            _layout_plan(a, hosts)  # a layout that cannot be planned is refused before any host is reached
    except ValueError as e:
        return err(str(e))
    # deferred: asyncssh loads only when a host is reached
    from app.hosts.link import HostError, SshOptions

    opts = ssh_options(a) or SshOptions()
    try:
        return asyncio.run(_check(hosts, opts, a.seconds, a.model, a if layout else None))
    except HostError as e:
        return err(str(e))


async def _check(hosts: list[Host], opts, seconds: float | None, model: str | None,
                 layout: argparse.Namespace | None = None) -> int:
    # deferred: as in cmd_hosts_check
    from app.hosts.checks import rig_findings, socket_interfaces
    from app.hosts.link import AgentLink

    probes = []
    for h in hosts:
        link = await AgentLink.open(h, ssh=opts)
        try:
            hello = link.hello
            cards = ", ".join(f"{c['index']}: {c['name']}" for c in hello.get("cards") or []) or \
                f"no GPU ({hello.get('nvml')}); CPU {hello['cpu']['cores']} cores, " \
                f"{hello['cpu']['memory_available_gib']:.1f}/{hello['cpu']['memory_total_gib']:.1f} GiB available"
            print(f"{h.label()}: vllm-dyno {hello['version']} on {hello['hostname']} (agent pid {hello['pid']})")
            print(f"  cards: {cards}")
            print(f"  {link.offset.describe()}")
            p = await link.probe(model)
            probes.append(p)
            v = p["vllm"]
            shm = f"{p['shm']['total_bytes'] / 2**30:.1f} GiB" if p.get("shm") else "none"
            m = p.get("model")
            there = "" if not m else f"; model {m['path']}: " + ("there" if m["exists"] else "NOT THERE")
            print("  vLLM: " + (v["error"] if "error" in v else f"{v['distribution']} {v['version']} "
                                 f"({v['launch_form']} form, {v['python']})") +
                  f"; /dev/shm {shm}; interface for {h.reach}: {socket_interfaces([h], [p])[h.label()] or 'none'}{there}")
            if seconds:
                got: list = []
                link.subscribe(got.extend)
                await link.watch()
                await asyncio.sleep(seconds)
                names = sorted({f"{s.source}.{s.name}" for s in got})
                print(f"  telemetry: {len(got)} samples in {seconds:g} s ({', '.join(names[:6])}"
                      f"{' …' if len(names) > 6 else ''})")
        finally:
            await link.close()
    plan = None
    if layout is not None:  # planned again with the interfaces the agents found
        from app.hosts.plan import render  # deferred: as above

        plan = _layout_plan(layout, hosts, socket_interfaces(hosts, probes))
        print("plan:\n" + render(plan))
    found = rig_findings(hosts, probes, plan) if len(hosts) > 1 else []
    for f in found:
        print(f)
    if len(hosts) > 1 and not found:
        print("the hosts can run one server together (one vLLM version, the model, /dev/shm, interfaces"
              + (", the layout's plan)" if plan else ")"))
    sys.stdout.flush()
    return 1 if any(f.level == "error" for f in found) else 0
