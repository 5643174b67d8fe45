"""GPU catalog, NVML names, unknown cards, version rules."""
from __future__ import annotations

import dataclasses
import os

import psutil
import pytest

from app.planner import cards as cards_mod
from app.planner.cards import NoGpuFound, cards_for, host_cores, host_memory_gib
from app.planner.gpus import (UnknownGpuError, catalog_rows, gpus_from_hardware, gpus_from_nvml, load_catalog,
                              lookup_gpu, resolve_gpu)
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


# ---------------------------------------------------------------------------- catalog consistency

#: CUDA compute capabilities of NVIDIA GPUs from Volta on (CUDA C++ Programming Guide,
#: "Compute Capabilities": 7.0 Volta, 7.5 Turing, 8.0 GA100, 8.6 GA10x, 8.9 Ada, 9.0 Hopper,
#: 10.0 B200, 12.0 GeForce RTX 50 / RTX PRO Blackwell, 12.1 GB10)
VALID_CC = {7.0, 7.5, 8.0, 8.6, 8.9, 9.0, 10.0, 12.0, 12.1}
ROW_FIELDS = {"name": str, "nvml_names": list, "memory_gb": (int, float), "memory_gib": (int, float),
              "bandwidth_gbs": (int, float), "tflops_bf16": (int, float), "fp8": bool, "cc": float, "pcie_gen": int,
              "nvlink_gbs": (int, float), "p2p": bool, "tdp_w": (int, float), "source": list}
FIGURES = {"memory_gib", "bandwidth_gbs", "tflops_bf16", "fp8", "cc", "pcie_gen", "nvlink_gbs", "p2p", "tdp_w"}


def test_every_catalog_row_has_the_fields_a_source_and_a_valid_capability():
    data = catalog_rows()
    sources, rows = data["sources"], data["gpus"]
    used = set()
    for r in rows:
        for field, kind in ROW_FIELDS.items():
            assert isinstance(r.get(field), kind), (r.get("name"), field)
        assert set(r) <= set(ROW_FIELDS) | {"assumed"}, (r["name"], set(r) - set(ROW_FIELDS))
        assert r["cc"] in VALID_CC, (r["name"], r["cc"])
        assert r["fp8"] == (r["cc"] >= 8.9), r["name"]  # FP8 tensor cores: Ada, Hopper, Blackwell
        assert r["pcie_gen"] in (3, 4, 5) and r["nvlink_gbs"] >= 0, r["name"]
        assert r["bandwidth_gbs"] > 0 and r["tflops_bf16"] > 0 and r["tdp_w"] > 0, r["name"]
        # NVML's total is a little under the size as sold, never above it
        assert 0.9 <= r["memory_gib"] / r["memory_gb"] <= 1.0, r["name"]
        assert r["source"] and set(r["source"]) <= set(sources), (r["name"], r["source"])
        assert set(r.get("assumed", [])) <= FIGURES, r["name"]
        assert r["nvml_names"] and all(isinstance(n, str) and n for n in r["nvml_names"]), r["name"]
        used |= set(r["source"])
    assert all(isinstance(v, str) and len(v) > 20 for v in sources.values())
    assert used == set(sources), f"sources no row cites: {set(sources) - used}"
    assert len(load_catalog()) == len(rows)  # names unique


def test_nvml_names_identify_one_row_each():
    """A name NVML reports belongs to one row, or to variants of one card that NVML's
    memory tells apart (RTX 4060 Ti 8 / 16 GB); every name — catalog and NVML — leads
    back to its row."""
    rows = catalog_rows()["gpus"]
    by_name: dict[str, list[dict]] = {}
    for r in rows:
        for n in r["nvml_names"]:
            by_name.setdefault(n.lower(), []).append(r)
    for n, rs in by_name.items():
        assert len({r["memory_gb"] for r in rs}) == len(rs), f"{n!r} is shared by rows of one size: {rs}"
    catalog_names = [r["name"].lower() for r in rows]
    assert len(set(catalog_names)) == len(catalog_names)
    for r in rows:
        assert lookup_gpu(r["name"]).name == r["name"]
        for n in r["nvml_names"]:
            assert lookup_gpu(n, r["memory_gib"]).name == r["name"], (n, r["name"])


@pytest.mark.parametrize("name", [
    # named missing in issue 16 item 11
    "Quadro RTX 6000", "Quadro RTX 8000", "RTX 4080 Super", "RTX 4070 Ti Super", "A40", "L40",
    # every family a workstation builder may have, Turing on
    "RTX 2080 Ti", "TITAN RTX", "RTX 3060", "RTX 3080", "RTX 3080 Ti", "RTX 4060 Ti 16GB", "RTX 4070 Super",
    "RTX 5060", "RTX 5070", "RTX A2000 12GB", "RTX A4000", "RTX A4500", "RTX A5000", "RTX A5500", "RTX 2000 Ada",
    "RTX 4000 SFF Ada", "RTX 4500 Ada", "RTX 5000 Ada", "RTX PRO 6000 Blackwell Max-Q", "RTX PRO 6000 Blackwell Server",
    "RTX PRO 5000 Blackwell", "L4", "A10", "A16", "A30", "A100 40GB PCIe", "H100 NVL", "H200 NVL", "GH200 96GB",
    "B200", "DGX Spark GB10"])
def test_catalog_has_the_card(name):
    assert name in load_catalog()


def test_datasheet_figures_of_the_cards_the_issue_names():
    cat = load_catalog()
    q8k = cat["Quadro RTX 8000"]  # Quadro RTX 8000 datasheet: 48 GB, 672 GB/s, 130.5 tensor TFLOPS, NVLink 100 GB/s
    assert (q8k.memory_gb, q8k.bandwidth_gbs, q8k.tflops_bf16, q8k.cc, q8k.nvlink_gbs, q8k.p2p) == \
        (48, 672, 130.5, 7.5, 100, True)
    assert cat["Quadro RTX 6000"].memory_gb == 24 and cat["Quadro RTX 6000"].tdp_w == 295
    l40, a40 = cat["L40"], cat["A40"]  # L40: BF16 181.05 dense, 300 W; A40: BF16 149.7 dense, 696 GB/s, NVLink 112.5
    assert (l40.tflops_bf16, l40.bandwidth_gbs, l40.tdp_w, l40.fp8) == (181, 864, 300, True)
    assert (a40.tflops_bf16, a40.bandwidth_gbs, a40.nvlink_gbs, a40.cc, a40.fp8) == (149.7, 696, 112.5, 8.6, False)
    s = cat["RTX 4080 Super"]
    assert (s.memory_gb, s.bandwidth_gbs, s.cc, s.p2p) == (16, 736, 8.9, False)
    assert cat["RTX 4070 Ti Super"].bandwidth_gbs == 672 and cat["RTX 4070 Ti Super"].memory_gb == 16
    # Turing has no FP8; Blackwell GeForce does
    assert not cat["Quadro RTX 8000"].fp8 and cat["RTX 5060"].fp8 and cat["DGX Spark GB10"].cc == 12.1


@pytest.mark.parametrize("nvml,memory,name", [
    ("NVIDIA GeForce RTX 4080 SUPER", 15.99, "RTX 4080 Super"),  # not the RTX 4080 any more
    ("NVIDIA GeForce RTX 4080", 15.99, "RTX 4080"),
    ("NVIDIA GeForce RTX 4060 Ti", 15.99, "RTX 4060 Ti 16GB"), ("NVIDIA GeForce RTX 4060 Ti", 7.99, "RTX 4060 Ti"),
    ("NVIDIA GeForce RTX 3080", 11.76, "RTX 3080 12GB"), ("NVIDIA GeForce RTX 3080", 10.0, "RTX 3080"),
    ("Quadro RTX 8000", 47.46, "Quadro RTX 8000"), ("NVIDIA GeForce RTX 5090 D v2", 23.5, "RTX 5090 D"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 95.0, "RTX PRO 6000 Blackwell Max-Q"),
    ("NVIDIA GH200 480GB", 95.0, "GH200 96GB"), ("NVIDIA A100-PCIE-40GB", 39.4, "A100 40GB PCIe")])
def test_nvml_names_with_memory_pick_the_variant(nvml, memory, name):
    assert lookup_gpu(nvml, memory).name == name


def test_names_that_only_contain_a_catalog_name_are_not_that_card():
    """A longer name is matched by whole words only, and a laptop part is another card:
    the RTX A400 (4 GB, 96 GB/s) is not an A40, a 5070 Ti Laptop GPU not the desktop card."""
    for name in ("NVIDIA RTX A400", "NVIDIA GeForce RTX 5070 Ti Laptop GPU", "NVIDIA A10G2"):
        with pytest.raises(UnknownGpuError, match="not in the catalog"):
            lookup_gpu(name, 4.0)



def test_a_name_two_variants_share_needs_the_memory(monkeypatch):
    """Without NVML's memory an NVML name is the card sold under it ("RTX 4060 Ti" is the
    8 GB one); where no variant carries the name itself, the memory must decide."""
    from app.planner import gpus as gpus_mod

    assert lookup_gpu("NVIDIA GeForce RTX 4060 Ti").name == "RTX 4060 Ti"
    cat = load_catalog()
    twins = [dataclasses.replace(cat[n], name=n + " (board)") for n in ("RTX 4060 Ti", "RTX 4060 Ti 16GB")]
    monkeypatch.setattr(gpus_mod, "load_catalog", lambda: {g.name: g for g in twins})
    with pytest.raises(UnknownGpuError, match=r"is one of RTX 4060 Ti \(board\), RTX 4060 Ti 16GB \(board\)") as e:
        lookup_gpu("NVIDIA GeForce RTX 4060 Ti")
    assert e.value.candidates == ("RTX 4060 Ti (board)", "RTX 4060 Ti 16GB (board)")
    assert lookup_gpu("NVIDIA GeForce RTX 4060 Ti", 15.99).name == "RTX 4060 Ti 16GB (board)"


@pytest.mark.parametrize("nvml,name", [("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2 32GB"),
                                       ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                       ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("rtx 5090", "RTX 5090"),
                                       ("NVIDIA H200", "H200 SXM")])
def test_nvml_names_map_to_entries(nvml, name):
    assert lookup_gpu(nvml).name == name


# ---------------------------------------------------------------------------- unknown cards: memory *and* capability

def test_unknown_card_plans_from_memory_and_capability_never_an_assumed_one():
    with pytest.raises(UnknownGpuError, match="not in the catalog"):
        lookup_gpu("NVIDIA Imaginary X1")
    with pytest.raises(UnknownGpuError, match=r"compute capability is not known .*NAME:GIB:CC.*Imaginary X1:20:8\.9"):
        resolve_gpu("NVIDIA Imaginary X1", 20.0)
    g = resolve_gpu("NVIDIA Imaginary X1", 20.0, cc=7.5)
    assert (g.memory_gib, g.cc, g.fp8) == (20.0, 7.5, False) and "cc" not in g.assumed
    assert "bandwidth_gbs" in g.assumed and "p2p" in g.assumed
    assert resolve_gpu("NVIDIA Imaginary X2", 32.0, cc=12.0).fp8  # FP8 tensor cores from 8.9
    # a catalog card: a capability that disagrees is a wrong name, one that agrees is fine
    with pytest.raises(ValueError, match="catalog's RTX 4090 has 8.9"):
        resolve_gpu("RTX 4090", 24.0, cc=8.0)
    assert resolve_gpu("RTX 4090", 24.0, cc=8.9).name == "RTX 4090"


def test_an_unknown_cards_capability_reaches_the_capability_checks():
    """Planned as 7.5, bfloat16 is refused (vLLM: "Bfloat16 is only supported on GPUs with
    compute capability of at least 8.0", vllm/platforms/cuda.py check_if_supports_dtype,
    0.32) — with the old assumed 8.0 it passed silently."""
    from app.config import ServerConfig
    from app.planner.models import from_catalog
    from app.planner.plan import plan

    cards = cards_for(gpu=["Voodoo 5:24:7.5"])
    p = plan(ServerConfig(model="m", dtype="bfloat16"), cards, from_catalog("Llama-3-8B"), use_calibration=False)
    assert p.verdict == "error" and "dtype_unsupported_by_gpu" in [f.problem for f in p.findings]
    ok = plan(ServerConfig(model="m", dtype="bfloat16"), cards_for(gpu=["Voodoo 5:24:8.6"]), from_catalog("Llama-3-8B"),
              use_calibration=False)
    assert "dtype_unsupported_by_gpu" not in [f.problem for f in ok.findings]


def test_hardware_mapping_busy_and_mixed():
    gs = gpus_from_hardware({"gpu": "RTX A6000", "count": 2, "busy_gib": [16.0]})
    assert [g.busy_gib for g in gs] == [16.0, 0.0]
    mixed = gpus_from_hardware({"gpus": [{"gpu": "RTX 5070 Ti", "memory_gib": 16}, {"gpu": "RTX 5090", "memory_gib": 32}]})
    assert [(g.name, g.memory_gib) for g in mixed] == [("RTX 5070 Ti", 16.0), ("RTX 5090", 32.0)]
    odd = gpus_from_hardware({"gpus": [{"gpu": "Voodoo 5", "memory_gib": 24, "cc": "7.5"}, {"gpu": "RTX 5090"}]})
    assert [(g.name, g.cc) for g in odd] == [("Voodoo 5", 7.5), ("RTX 5090", 12.0)]
    assert [g.cc for g in gpus_from_hardware({"gpu": "Voodoo 5", "memory_gib": 24, "cc": 8.6, "count": 2})] == [8.6, 8.6]
    with pytest.raises(UnknownGpuError, match="compute capability"):
        gpus_from_hardware({"gpu": "Voodoo 5", "memory_gib": 24})


def test_gpus_from_nvml_double():
    """A card NVML reports but the catalog lacks plans with NVML's memory and the
    capability NVML reports (nvmlDeviceGetCudaComputeCapability); where NVML reports none
    the plan stops with the fix instead of assuming one."""
    nv = NvmlDouble([FakeGpu(0, memory_total=24564 * 2**20, memory_used=int(1.5 * G)),
                     FakeGpu(1, memory_total=40 * G, memory_used=0, returns={"nvmlDeviceGetName": b"NVIDIA Future 9000"},
                             cc=(10, 3))])
    gs = gpus_from_nvml(nv)
    assert gs[0].name == "RTX 4090" and gs[0].memory_gib == pytest.approx(23.99, abs=0.01)
    assert gs[0].busy_gib == pytest.approx(1.5)
    assert gs[1].name == "NVIDIA Future 9000" and gs[1].memory_gib == 40 and gs[1].cc == 10.3
    assert "cc" not in gs[1].assumed and gs[1].fp8
    assert [g.name for g in gpus_from_nvml(nv, [1])] == ["NVIDIA Future 9000"]
    assert not nv.initialized and nv.calls[("nvmlShutdown", None)] == 2
    nv.gpus[1].raises["nvmlDeviceGetCudaComputeCapability"] = "NVMLError_NotSupported"
    with pytest.raises(UnknownGpuError, match=r"NVML did not report it for GPU 1.*Future 9000:40:8\.9"):
        gpus_from_nvml(nv)
    assert [g.name for g in gpus_from_nvml(nv, [0])] == ["RTX 4090"]  # a catalog card needs no capability
    # the card's own capability wins over the catalog's (a variant NVML names like a catalog card)
    odd = NvmlDouble([FakeGpu(0, name="NVIDIA GeForce RTX 3060", memory_total=12 * G, cc=(8, 7))])
    assert gpus_from_nvml(odd)[0].cc == 8.7


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
    one = cards_for(gpu=["Voodoo 5:24:8.6"], count=3, busy_gib=2.0)
    assert len(one) == 3 and one[0].memory_gib == 24 and one[0].busy_gib == 2.0 and "p2p" in one[0].assumed
    assert one[0].cc == 8.6
    with pytest.raises(UnknownGpuError, match="not in the catalog") as e:
        cards_for(gpu=["Voodoo 5"])
    assert e.value.name == "Voodoo 5"
    with pytest.raises(UnknownGpuError, match="memory, 24 GiB, is given but not the capability") as e:
        cards_for(gpu=["Voodoo 5:24"])
    assert e.value.name == "Voodoo 5"
    assert cards_for(gpu="Voodoo 5", memory_gib=24, cc=7.5)[0].cc == 7.5  # a fingerprint's own figures
    for bad, why in (("Voodoo 5:24:89", "not a compute capability"), ("Voodoo 5:24:8.9:x", "NAME:GIB:CC"),
                     ("Voodoo 5:24:eight", "not a compute capability")):
        with pytest.raises(ValueError, match=why):
            cards_for(gpu=[bad])
    with pytest.raises(ValueError, match="not a memory size in GiB"):
        cards_for(gpu=["RTX 4090:lots"])
    with pytest.raises(ValueError, match="cannot be mixed"):
        cards_for(gpu=["CPU", "RTX 4090"])
    # the fingerprint of a profile plans through cards_for
    fp = HardwareFingerprint(gpu="NVIDIA GeForce RTX 4090", count=2, memory_gib=23.99)
    assert [(g.name, g.memory_gib) for g in fp.planner_cards()] == [("RTX 4090", 23.99)] * 2
    unknown = HardwareFingerprint(gpu="NVIDIA Future 9000", count=2, memory_gib=40.0, compute_capability=10.3)
    assert [(g.name, g.cc) for g in unknown.planner_cards()] == [("NVIDIA Future 9000", 10.3)] * 2
    with pytest.raises(UnknownGpuError, match="compute capability"):
        HardwareFingerprint(gpu="NVIDIA Future 9000", memory_gib=40.0).planner_cards()


def test_a_run_records_the_capability_of_this_machines_cards(monkeypatch):
    """The fingerprint of a run on a card the catalog lacks keeps NVML's capability, so
    the profile plans again later."""
    from app.run import hardware
    from app.telemetry import nvml as nvml_mod

    nv = NvmlDouble([FakeGpu(0, name="NVIDIA Future 9000", memory_total=40 * G, cc=(10, 3)),
                     FakeGpu(1, name="NVIDIA Future 9000", memory_total=40 * G, cc=(10, 3))])
    monkeypatch.setattr(hardware, "read_cards", lambda indices: nvml_mod.read_cards(indices, nv))
    fp = hardware.local_hardware(None, "0.32.0", cpu_build=False)
    assert (fp.gpu, fp.count, fp.compute_capability) == ("NVIDIA Future 9000", 2, 10.3)
    assert [g.cc for g in fp.planner_cards()] == [10.3, 10.3]


def test_cards_for_readings_of_selected_cards():
    rs = [GpuReading(index=i, name="NVIDIA GeForce RTX 4090", memory_total_bytes=24 * G, memory_used_bytes=i * G)
          for i in range(4)]
    gs = cards_for(readings=rs, indices=[1, 3])
    assert [g.busy_gib for g in gs] == [1.0, 3.0] and gs[0].name == "RTX 4090"
    assert len(cards_for(readings=rs)) == 4
    with pytest.raises(NoGpuFound, match="selected"):
        cards_for(readings=rs, indices=[7])
    # NVML memory info v2: the driver's reservation is held too (total − free), as under v1
    v2 = GpuReading(index=0, name="NVIDIA GeForce RTX 4090", memory_total_bytes=24 * G, memory_used_bytes=1 * G,
                    memory_reserved_bytes=G // 2, memory_free_bytes=24 * G - 3 * G // 2)
    assert cards_for(readings=[v2])[0].busy_gib == 1.5


def test_readings_of_a_card_the_catalog_lacks_plan_with_nvmls_capability():
    """The GUI plans from NVML readings: a card the catalog does not know plans with the
    reading's memory and compute capability; without a capability the plan names the fix."""
    r = GpuReading(index=2, name="NVIDIA Future 9000", memory_total_bytes=40 * G, memory_used_bytes=G,
                   memory_reserved_bytes=0, memory_free_bytes=39 * G, compute_capability=(7, 5))
    (g,) = cards_for(readings=[r])
    assert (g.name, g.memory_gib, g.busy_gib, g.cc) == ("NVIDIA Future 9000", 40.0, 1.0, 7.5)
    blind = r.model_copy(update={"compute_capability": None, "unavailable": {"compute_capability": "not supported"}})
    with pytest.raises(UnknownGpuError, match="NVML did not report it for GPU 2: not supported"):
        cards_for(readings=[blind])
    # DGX Spark: NVML reports no memory for GB10's unified memory — the catalog's figure plans
    spark = GpuReading(index=0, name="NVIDIA GB10", compute_capability=(12, 1),
                       unavailable={f: "not supported" for f in ("memory_total_bytes", "memory_used_bytes")})
    (g,) = cards_for(readings=[spark])
    assert (g.name, g.cc, g.busy_gib) == ("DGX Spark GB10", 12.1, 0.0) and "memory_gib" in g.assumed


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


def test_link_catalog_rows_are_sourced_and_ordered_by_rate():
    """Every inter-host link has its line rate, a payload bandwidth below the line rate
    (never above the standard), a latency, and sources from ``link_sources``."""
    from app.planner.gpus import load_links
    data = catalog_rows()
    sources, rows = data["link_sources"], data["links"]
    used = set()
    for r in rows:
        assert 0 < r["bandwidth_gbs"] < r["line_gbps"] / 8, r["name"]  # GB/s of payload < Gb/s ÷ 8
        assert 0.8 < r["bandwidth_gbs"] / (r["line_gbps"] / 8) < 1.0, r["name"]
        assert r["latency_us"] > 0 and r["source"] and set(r["source"]) <= set(sources), r["name"]
        assert set(r.get("assumed", [])) <= {"bandwidth_gbs", "latency_us"}, r["name"]
        used |= set(r["source"])
    assert used == set(sources)
    links = list(load_links().values())
    assert [x.name for x in links] == ["10gbe", "25gbe", "100gbe", "ib-hdr200", "ib-ndr400"]
    assert all(a.bandwidth_gbs < b.bandwidth_gbs for a, b in zip(links, links[1:]))


def test_unknown_link_names_the_catalog_and_rig_layout_checks_counts():
    from app.planner.gpus import UnknownLinkError, lookup_link, rig_layout
    assert lookup_link("IB_HDR200").name == "ib-hdr200" and lookup_link("10GbE").name == "10gbe"
    with pytest.raises(UnknownLinkError, match="ib-hdr200.*--list-gpus"):
        lookup_link("infiniband")
    with pytest.raises(ValueError, match="needs the link"):
        rig_layout(4, 1, None)
    with pytest.raises(ValueError, match="at least one"):
        rig_layout(0, 1, "10gbe")
    r = rig_layout(4, 1, "ib-hdr200")
    assert r.multi_host and [r.host_of(i) for i in range(4)] == [0, 1, 2, 3]
    assert r.describe() == "4 hosts × 1 card, InfiniBand HDR 200 Gb/s"
