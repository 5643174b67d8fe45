"""What the window shows before a launch over several hosts, and exports (issue 21,
item 3: the per-host commands "shown to the user before launch and exportable as
commands"): the launch plan as ``vllm-dyno hosts plan`` prints it (app.hosts.plan
``launch_plan`` and ``render``), the findings the hosts' entries give without asking their
agents (app.hosts.checks ``layout_findings``), what the head's API server exposes, and
the plan as a shell script (app.hosts.plan ``script``).

The plan here is made without the agents' probes, so it lacks what the launch adds from
them: ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` per host (the interface that holds
its address) and the checks of each host's vLLM, model and ``/dev/shm``
(app.hosts.checks ``rig_findings``; the launch is refused on an error there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from app.config import ServerConfig, exposure_lines, exposure_problem, is_wildcard_host
from app.hosts.checks import Finding, layout_findings
from app.hosts.plan import HostCommand, PlanError, launch_plan, render, script
from app.hosts.spec import Host


@dataclass(frozen=True)
class RigPreview:
    """``plan``: the per-host commands (``[]`` when the layout cannot run: ``error``, the
    PlanError's message, says why and what fits); ``findings``: the hosts' own
    (app.hosts.checks.layout_findings); ``exposure``: what the head's API server
    exposes, lines (``[]``: it listens on loopback only)."""

    hosts: list[Host]
    plan: list[HostCommand] = field(default_factory=list)
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)
    exposure: list[str] = field(default_factory=list)

    @property
    def can_launch(self) -> bool:
        """A plan, and no finding of level ``error``."""
        return self.error is None and not any(f.level == "error" for f in self.findings)

    @property
    def exposed(self) -> bool:
        """The head's API server listens beyond its machine (launching needs the user's word)."""
        return bool(self.exposure)

    def text(self) -> str:
        """The plan as ``vllm-dyno hosts plan`` prints it ("" without one)."""
        return render(self.plan) if self.plan else ""

    def script(self) -> str:
        """The plan as a shell script of ``ssh`` lines (app.hosts.plan.script). Raises
        PlanError without a plan."""
        if not self.plan:
            raise PlanError(self.error or "no launch plan")
        return script(self.plan)


def rig_preview(hosts: Sequence[Host], config: ServerConfig, ray_address: str | None = None) -> RigPreview:
    """The preview of launching ``config`` over ``hosts`` (the first is the head; the
    plan of the config's backend, :func:`app.hosts.plan.launch_plan`, attached to the Ray
    cluster at ``ray_address`` if given)."""
    hosts = list(hosts)
    found = layout_findings(hosts)
    try:
        plan = launch_plan(hosts, config, ray_address=ray_address)
    except PlanError as e:
        return RigPreview(hosts, error=str(e), findings=found)
    head = next(c for c in plan if c.kind == "serve")  # the API server's part (a Ray plan starts its nodes first)
    lines: list[str] = []
    if exposure_problem(head.config.host):
        # the head's environment there is what the plan sends (its own is not known here)
        lines = exposure_lines(head.config.host, head.config.port, dict(head.config.env))
        if is_wildcard_host(head.config.host) and not head.host.is_local:  # not this machine's addresses
            port = "" if head.config.port is None else f":{head.config.port}"
            lines[0] = (f"listening on all interfaces ({head.config.host}{port}) of {head.host.label()}, "
                        "reachable from other machines")
        lines[0] = f"head {head.host.label()}: {lines[0]}"
    return RigPreview(hosts, plan=plan, findings=found, exposure=lines)
