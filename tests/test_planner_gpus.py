"""GPU catalog, NVML names, unknown cards, version rules."""
from __future__ import annotations

import os

import psutil
import pytest

from app.planner import cards as cards_mod
from app.planner.cards import NoGpuFound, cards_for, host_cores, host_memory_gib
from app.planner.gpus import (UnknownGpuError, gpus_from_hardware, gpus_from_nvml, load_catalog, lookup_gpu,
                              resolve_gpu)
from app.planner.versions import newest_known, rules_for
from app.profiles.model import HardwareFingerprint
from app.telemetry.gpu_source import GpuReading
from tests.nvml_double import FakeGpu, NvmlDouble

G = 2**30

PERF_MODEL_CARDS = ["Tesla T4", "Tesla V100 SXM2 32GB", "RTX 3090", "RTX 4090", "RTX 5060 Ti 16GB", "RTX 5070 Ti",
                    "RTX 5080", "RTX 5090", "RTX 6000 Ada", "RTX A6000", "L40S", "A100 80GB SXM", "H100 SXM",
                    "H100 PCIe", "H200 SXM"]


def test_catalog_holds_every_perf_model_card_with_all_fields():
    cat = load_catalog()
    for name in PERF_MODEL_CARDS:
        g = cat[name]
        assert g.memory_gib > 0 and g.bandwidth_gbs > 0 and g.tflops_bf16 > 0 and g.cc > 0 and g.tdp_w > 0
    assert cat["RTX 5090"].bandwidth_gbs == 1792 and cat["RTX 5090"].tflops_bf16 == 209 and not cat["RTX 5090"].p2p
    assert "tflops_bf16" in cat["RTX 5080"].assumed and "tflops_bf16" in cat["Tesla T4"].assumed
    assert cat["H100 SXM"].nvlink_gbs == 900 and cat["H100 SXM"].fp8


@pytest.mark.parametrize("nvml,name", [("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2 32GB"),
                                       ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                       ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("rtx 5090", "RTX 5090"),
                                       ("NVIDIA H200", "H200 SXM")])
def test_nvml_names_map_to_entries(nvml, name):
    assert lookup_gpu(nvml).name == name


def test_unknown_card_plans_from_memory_with_assumed_figures():
    with pytest.raises(UnknownGpuError, match="not in the catalog"):
        lookup_gpu("NVIDIA Imaginary X1")
    g = resolve_gpu("NVIDIA Imaginary X1", 20.0)
    assert g.memory_gib == 20.0 and "bandwidth_gbs" in g.assumed and "p2p" in g.assumed


def test_hardware_mapping_busy_and_mixed():
    gs = gpus_from_hardware({"gpu": "RTX A6000", "count": 2, "busy_gib": [16.0]})
    assert [g.busy_gib for g in gs] == [16.0, 0.0]
    mixed = gpus_from_hardware({"gpus": [{"gpu": "RTX 5070 Ti", "memory_gib": 16}, {"gpu": "RTX 5090", "memory_gib": 32}]})
    assert [(g.name, g.memory_gib) for g in mixed] == [("RTX 5070 Ti", 16.0), ("RTX 5090", 32.0)]


def test_gpus_from_nvml_double():
    nv = NvmlDouble([FakeGpu(0, memory_total=24564 * 2**20, memory_used=int(1.5 * G)),
                     FakeGpu(1, memory_total=40 * G, memory_used=0, returns={"nvmlDeviceGetName": b"NVIDIA Future 9000"},
                             raises={"nvmlDeviceGetCudaComputeCapability": "NVMLError_NotSupported"})])
    gs = gpus_from_nvml(nv)
    assert gs[0].name == "RTX 4090" and gs[0].memory_gib == pytest.approx(23.99, abs=0.01)
    assert gs[0].busy_gib == pytest.approx(1.5)
    assert gs[1].name == "NVIDIA Future 9000" and gs[1].memory_gib == 40 and "cc" in gs[1].assumed
    assert [g.name for g in gpus_from_nvml(nv, [1])] == ["NVIDIA Future 9000"]
    assert not nv.initialized and nv.calls[("nvmlShutdown", None)] == 2


def test_nvml_unavailable_gives_no_cards():
    assert gpus_from_nvml(NvmlDouble(2, init_raises="NVMLError_DriverNotLoaded")) == []


# ---------------------------------------------------------------------------- cards_for: one source each

def test_cards_for_sim_rig():
    gs = cards_for(engine="sim", gpu="RTX 4090", count=8)
    assert len(gs) == 8 and {g.name for g in gs} == {"RTX 4090"}
    # a sim rig is the rig only: readings and the CPU build are not looked at
    assert cards_for(engine="sim", gpu="H100 SXM", count=2, readings=[], cpu_build=True)[0].name == "H100 SXM"
    with pytest.raises(ValueError, match="GPU name"):
        cards_for(engine="sim", count=2)


def test_cards_for_named_cards_like_a_fingerprint():
    mixed = cards_for(gpu="RTX 5070 Ti + RTX 5090", count=4)
    assert [g.name for g in mixed] == ["RTX 5070 Ti", "RTX 5090", "RTX 5070 Ti", "RTX 5090"]
    assert [g.name for g in cards_for(gpu=["RTX 5070 Ti", "RTX 5090"])] == ["RTX 5070 Ti", "RTX 5090"]
    one = cards_for(gpu=["Voodoo 5:24"], count=3, busy_gib=2.0)
    assert len(one) == 3 and one[0].memory_gib == 24 and one[0].busy_gib == 2.0 and "p2p" in one[0].assumed
    with pytest.raises(UnknownGpuError, match="not in the catalog") as e:
        cards_for(gpu=["Voodoo 5"])
    assert e.value.name == "Voodoo 5"
    with pytest.raises(ValueError, match="not a memory size in GiB"):
        cards_for(gpu=["RTX 4090:lots"])
    with pytest.raises(ValueError, match="cannot be mixed"):
        cards_for(gpu=["CPU", "RTX 4090"])
    # the fingerprint of a profile plans through cards_for
    fp = HardwareFingerprint(gpu="NVIDIA GeForce RTX 4090", count=2, memory_gib=23.99)
    assert [(g.name, g.memory_gib) for g in fp.planner_cards()] == [("RTX 4090", 23.99)] * 2


def test_cards_for_readings_of_selected_cards():
    rs = [GpuReading(index=i, name="NVIDIA GeForce RTX 4090", memory_total_bytes=24 * G, memory_used_bytes=i * G)
          for i in range(4)]
    gs = cards_for(readings=rs, indices=[1, 3])
    assert [g.busy_gib for g in gs] == [1.0, 3.0] and gs[0].name == "RTX 4090"
    assert len(cards_for(readings=rs)) == 4
    with pytest.raises(NoGpuFound, match="selected"):
        cards_for(readings=rs, indices=[7])


def test_cards_for_this_machine_through_nvml():
    nv = NvmlDouble([FakeGpu(0), FakeGpu(1, name="NVIDIA H100 80GB HBM3", memory_total=80 * G, cc=(9, 0))])
    gs = cards_for(indices=[1], nvml=nv)
    assert [g.name for g in gs] == ["H100 SXM"] and gs[0].memory_gib == 80 and gs[0].busy_gib == 1.0
    assert [g.name for g in cards_for(nvml=nv)] == ["RTX 4090", "H100 SXM"]
    with pytest.raises(NoGpuFound, match="no GPU found through NVML: the NVIDIA driver is not loaded"):
        cards_for(nvml=NvmlDouble(2, init_raises="NVMLError_DriverNotLoaded"))
    with pytest.raises(NoGpuFound, match="no GPU found"):
        cards_for(nvml=NvmlDouble(0))
    with pytest.raises(ValueError, match="not present"):
        cards_for(indices=[5], nvml=nv)


def test_cards_for_cpu_build_uses_the_real_cores_and_node_memory(tmp_path, monkeypatch):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else psutil.cpu_count(logical=True)
    assert host_cores() == cores
    (c,) = cards_for(cpu_build=True)
    assert c.kind == "cpu" and c.tflops_bf16 == pytest.approx(0.05 * cores)
    assert c.bandwidth_gbs == pytest.approx(10.0 * min(cores, 4))
    node0 = cards_mod.NODE0_MEMINFO
    if node0.exists():  # a NUMA machine: one node's MemTotal, not the host total
        kb = int(next(line for line in node0.read_text().splitlines() if "MemTotal" in line).split()[-2])
        assert c.memory_gib == pytest.approx(kb * 1024 / G)
    else:
        assert c.memory_gib == pytest.approx(psutil.virtual_memory().total / G)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("Node 0 MemTotal:       16777216 kB\nNode 0 MemFree:        1000 kB\n")
    monkeypatch.setattr(cards_mod, "NODE0_MEMINFO", meminfo)
    assert host_memory_gib() == 16.0
    two = cards_for(gpu="CPU", count=2)  # TP 2 over two NUMA nodes: one device per node
    assert len(two) == 2 and two[0].memory_gib == 16.0 and two[0].tflops_bf16 == pytest.approx(0.05 * cores)
    assert cards_for(gpu=["CPU:8"])[0].memory_gib == 8.0
    monkeypatch.setattr(cards_mod, "NODE0_MEMINFO", tmp_path / "absent")
    assert host_memory_gib() == pytest.approx(psutil.virtual_memory().total / G)
    # a CPU fingerprint: its memory, this machine's cores (no guessed count)
    fp = HardwareFingerprint(gpu="CPU", memory_gib=12.0).planner_cards()
    assert [(g.kind, g.memory_gib, g.tflops_bf16) for g in fp] == [("cpu", 12.0, pytest.approx(0.05 * cores))]
    assert HardwareFingerprint(gpu="CPU").planner_cards()[0].memory_gib == pytest.approx(psutil.virtual_memory().total / G)


def test_cards_for_refuses_two_sources_and_attach():
    with pytest.raises(ValueError, match="one source"):
        cards_for(gpu="RTX 4090", readings=[])
    with pytest.raises(ValueError, match="one source"):
        cards_for(gpu="RTX 4090", cpu_build=True)
    assert cards_for(gpu="CPU", cpu_build=True)[0].kind == "cpu"
    with pytest.raises(ValueError, match="attached"):
        cards_for(engine="attach")


def test_version_rules():
    assert rules_for("0.10.2").default_utilization == 0.9
    assert rules_for("0.32.0+cpu").default_utilization == 0.92
    assert rules_for(None).version == newest_known() == "0.33"
    assert "swap-space" in rules_for("0.32.0").removed_options and not rules_for("0.11.0").removed_options
    # QuantizationMethods in vllm/model_executor/layers/quantization/__init__.py: gguf up to 0.11.0, gone in 0.32.0
    assert "gguf" not in rules_for("0.32.0").quantization_methods and "gguf" in rules_for("0.11.0").quantization_methods
    r = rules_for("0.32.0")
    assert r.batch_defaults(31.8, "RTX 5090") == (256, 2048)
    assert r.batch_defaults(79.2, "H100 SXM") == (1024, 8192)
    assert r.batch_defaults(79.2, "A100 80GB SXM") == (256, 2048)
    assert r.batch_defaults(139.8, "H200 SXM") == (1024, 8192) and r.batch_defaults(178, "B200") == (1024, 16384)
