"""GPU catalog, NVML names, unknown cards, version rules."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.planner.gpus import UnknownGpuError, gpus_from_hardware, gpus_from_nvml, load_catalog, lookup_gpu, resolve_gpu
from app.planner.versions import newest_known, rules_for

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


class FakeNvml:
    """Shaped like pynvml: nvmlInit/Shutdown, handles by index, NVMLError classes."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, cards):
        self.cards = cards
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.cards[h][0]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.cards[h][1], used=self.cards[h][2], free=self.cards[h][1] - self.cards[h][2])

    def nvmlDeviceGetCudaComputeCapability(self, h):
        if self.cards[h][3] is None:
            raise self.NVMLError_NotSupported()
        return self.cards[h][3]


def test_gpus_from_nvml_double():
    G = 2**30
    nv = FakeNvml([("NVIDIA GeForce RTX 4090", 24564 * 2**20, int(1.5 * G), (8, 9)),
                   (b"NVIDIA Future 9000", 40 * G, 0, None)])
    gs = gpus_from_nvml(nv)
    assert gs[0].name == "RTX 4090" and gs[0].memory_gib == pytest.approx(23.99, abs=0.01)
    assert gs[0].busy_gib == pytest.approx(1.5)
    assert gs[1].name == "NVIDIA Future 9000" and gs[1].memory_gib == 40 and "cc" in gs[1].assumed
    assert nv.shut


def test_nvml_unavailable_gives_no_cards():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise self.NVMLError("Driver Not Loaded")

    assert gpus_from_nvml(Broken([])) == []


def test_version_rules():
    assert rules_for("0.10.2").default_utilization == 0.9
    assert rules_for("0.32.0+cpu").default_utilization == 0.92
    assert rules_for(None).version == newest_known() == "0.33"
    assert "swap-space" in rules_for("0.32.0").removed_options and not rules_for("0.11.0").removed_options
    assert "gguf" not in rules_for("0.33.1").quantization_methods and "gguf" in rules_for("0.32.0").quantization_methods
    r = rules_for("0.32.0")
    assert r.batch_defaults(31.8, "RTX 5090") == (256, 2048)
    assert r.batch_defaults(79.2, "H100 SXM") == (1024, 8192)
    assert r.batch_defaults(79.2, "A100 80GB SXM") == (256, 2048)
    assert r.batch_defaults(139.8, "H200 SXM") == (1024, 8192) and r.batch_defaults(178, "B200") == (1024, 16384)
