"""What the host's PCIe set-up does to GPU peer-to-peer (P2P) traffic: the IOMMU and
PCIe Access Control Services (ACS), an input of the plan (:func:`app.planner.plan.plan`,
``host=``).

NCCL's troubleshooting guide ("PCI Access Control Services (ACS)"): "IO virtualization
(also known as, VT-d or IOMMU) can interfere with GPU Direct by redirecting all PCI
point-to-point traffic to the CPU root complex, causing a significant performance
reduction or even a hang." Linux turns ACS on at the PCIe bridges when it finds an
Intel or AMD IOMMU (``pci_request_acs()``, called from drivers/iommu/intel/dmar.c and
drivers/iommu/amd/init.c), in passthrough mode (``iommu=pt``) as well, so an IOMMU that
the kernel uses means ACS redirection too.

What can be read without root: the IOMMU groups the kernel made
(``/sys/kernel/iommu_groups/N``, one per isolated set of devices, none when no IOMMU is
in use) and each group's default domain ``type`` (``DMA``/``DMA-FQ`` translated,
``identity`` passthrough; Documentation/ABI/testing/sysfs-kernel-iommu_groups), plus the
kernel command line (``/proc/cmdline``). ACS itself sits in PCIe extended configuration
space, which only root can read (``sudo lspci -vvv | grep ACSCtl``): it is an input the
user gives (``--acs on``), never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: where the kernel lists IOMMU groups (Linux sysfs) and its command line
IOMMU_GROUPS = Path("/sys/kernel/iommu_groups")
KERNEL_CMDLINE = Path("/proc/cmdline")

IOMMU_MODES = ("off", "translated", "passthrough")


@dataclass(frozen=True)
class HostPcie:
    """The host's IOMMU and ACS as far as they matter to P2P.

    ``iommu``: "off" (no IOMMU groups), "translated" (DMA remapping), "passthrough"
    (``iommu=pt``: identity domains) or None (unknown: not read, not Linux). ``acs``:
    True/False when the user knows (``lspci -vvv`` shows ``ACSCtl: SrcValid+`` …), None
    when unknown. ``source``: where the figures come from, for the plan's message."""

    iommu: str | None = None
    acs: bool | None = None
    source: str = "given"

    @property
    def redirects_p2p(self) -> bool:
        """True when P2P between PCIe cards goes up to the root complex: the kernel uses
        an IOMMU (it then enables ACS, passthrough included) or ACS is known to be on."""
        return self.iommu in ("translated", "passthrough") or self.acs is True

    def describe(self) -> str:
        """"IOMMU on, translated [/sys/kernel/iommu_groups: 42 groups, type DMA-FQ]"."""
        parts = []
        if self.iommu is not None:
            parts.append("IOMMU off" if self.iommu == "off" else f"IOMMU on, {self.iommu}")
        if self.acs is not None:
            parts.append(f"ACS {'on' if self.acs else 'off'}")
        return ", ".join(parts or ["IOMMU and ACS unknown"]) + f" [{self.source}]"


def read_host_pcie(groups_dir: Path | None = None, cmdline: Path | None = None) -> HostPcie:
    """This machine's IOMMU state, read without root: the groups under ``groups_dir``
    (default :data:`IOMMU_GROUPS`) and their ``type``; the ``iommu`` words of the kernel
    command line (``cmdline``, default :data:`KERNEL_CMDLINE`) go into ``source``. A
    missing groups directory (not Linux, sysfs not mounted) gives ``iommu=None``. ACS
    is left unknown (root only)."""
    gdir = IOMMU_GROUPS if groups_dir is None else groups_dir
    cpath = KERNEL_CMDLINE if cmdline is None else cmdline
    try:
        words = [w for w in cpath.read_text().split() if "iommu" in w.lower()]
    except OSError:
        words = []
    extra = f"; kernel command line: {' '.join(words)}" if words else ""
    try:
        groups = [g for g in gdir.iterdir() if g.is_dir()]
    except OSError:
        return HostPcie(None, None, f"{gdir} not readable{extra}")
    if not groups:
        return HostPcie("off", None, f"{gdir}: no IOMMU groups{extra}")
    types = set()
    for g in groups:
        try:
            types.add(g.joinpath("type").read_text().strip())
        except OSError:
            types.add("DMA")  # kernels before 5.x have no type file: the domain translates
    mode = "passthrough" if types == {"identity"} else "translated"
    return HostPcie(mode, None, f"{gdir}: {len(groups)} groups, type {'/'.join(sorted(types))}{extra}")
