"""GPU sampling through NVML: the cases in tests/cases/nvml/ and a pynvml-shaped double."""
from __future__ import annotations

import logging
import math
import os
import sys
import time

import pynvml
import pytest
import yaml

from app.telemetry import throttle
from app.telemetry.gpu_sampler import GpuSampler, reading_samples
from app.telemetry.gpu_source import GpuSource
from tests.nvml_double import FUNCTIONS, FakeGpu, NvmlDouble
from app.telemetry.nvml_source import NvmlSource
from app.telemetry.series import SeriesBank
from tests.conftest import CASES

NVML_CASES = sorted((CASES / "nvml").glob("*.yaml"))


def double_from_case(case: dict) -> NvmlDouble:
    gpus = []
    for d in case["devices"]:
        g = FakeGpu(d["index"], raises=dict(d.get("raises", {})), returns=dict(d.get("returns", {})))
        if d.get("returns", {}).get("nvmlDeviceGetMigMode"):
            g.mig = tuple(d["returns"]["nvmlDeviceGetMigMode"])
        gpus.append(g)
    return NvmlDouble(gpus)


def test_double_is_shaped_like_pynvml():
    d = NvmlDouble(1)
    for fn in FUNCTIONS:
        assert callable(getattr(pynvml, fn)), fn
    assert d.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert d.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
    assert isinstance(NvmlSource(nvml=d), GpuSource)


@pytest.mark.parametrize("path", NVML_CASES, ids=[p.stem for p in NVML_CASES])
def test_nvml_case(path, caplog):
    case = yaml.safe_load(path.read_text())
    exp = case["expect"]
    nv = double_from_case(case)
    src = NvmlSource(nvml=nv)
    assert src.open().ok
    rounds = [src.read() for _ in range(6)]  # no exception (expect.no_exception)
    last = {r.index: r for r in rounds[-1]}
    for key, want in exp.items():
        if not key.startswith("gpu"):
            continue
        r = last[int(key[3:])]
        for field, val in want.items():
            if field == "state":
                assert r.state == val
            elif field == "utilization":
                assert val == "not_available"
                assert r.util_gpu_pct is None and r.util_memory_pct is None
                assert "util_gpu_pct" in r.unavailable
            else:
                assert val == "not_available"
                assert getattr(r, field) is None, field  # never 0
                assert field in r.unavailable
    if exp.get("others_keep_updating"):
        nv.gpus[0].power_mw = 123_000
        assert {r.index: r for r in src.read()}[0].power_w == 123.0
    if exp.get("unsupported_fields_not_retried_every_tick"):
        for (fn, idx), want_raise in ((k, v) for d in case["devices"] for k, v in
                                      [((fn, d["index"]), e) for fn, e in d.get("raises", {}).items()]):
            if fn == "nvmlDeviceGetHandleByIndex":
                assert nv.calls[(fn, idx)] <= 2  # once at open, at most one re-probe
            else:
                assert nv.calls[(fn, idx)] == 1, (fn, idx)
    # samples: a field that is not available yields no sample, never 0
    samples = reading_samples(1.0, last[1])
    assert not [s for s in samples if s.name in ("power_w", "fan_pct")]


@pytest.mark.parametrize("path", NVML_CASES, ids=[p.stem for p in NVML_CASES])
def test_nvml_case_init_failures(path, caplog):
    case = yaml.safe_load(path.read_text())
    for fail in case.get("init_failures", []):
        nv = NvmlDouble(2, init_raises=fail["raises"])
        sampler = GpuSampler(NvmlSource(nvml=nv), interval=0.01)
        seen = []
        sampler.on_status(seen.append)
        with caplog.at_level(logging.WARNING):
            sampler.start()
            sampler._thread.join(5)
        assert not sampler.running, "the sampler stops when NVML cannot start"
        assert len(seen) == 1 and not seen[0].ok  # reported once
        msg = seen[0].message
        assert seen[0].state == fail["state"] and fail["message"] in msg
        assert "Traceback" not in caplog.text
        assert sum(msg in r.getMessage() for r in caplog.records) == 1
        caplog.clear()


def test_eight_gpus_all_fields_and_session_facts():
    nv = NvmlDouble(8)
    nv.gpus[5].temp_memory = 71
    nv.gpus[5].throttle = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    nv.gpus[2].processes = [(os.getpid(), 3 * 2**30), (999_999_999, None)]
    src = NvmlSource(nvml=nv, server_pgid=os.getpgid(0))
    assert src.open().ok
    info = src.session_info()
    assert info.driver_version == "550.54.15" and info.cuda_version == "12.4"
    assert len(info.gpus) == 8 and info.gpus[0].compute_capability == (8, 9)
    assert info.p2p[0][1] == "gpu_not_supported" and info.p2p[0][0] is None and info.p2p_ok is False
    assert info.topology[1][0] == "hostbridge"
    rs = src.read()
    assert [r.index for r in rs] == list(range(8))
    r = rs[5]
    assert r.temp_memory_c == 71.0 and rs[0].temp_memory_c is None and "temp_memory_c" in rs[0].unavailable
    assert r.throttle == ["power cap", "thermal (hardware)"]
    assert r.power_w == 30.0 and r.power_limit_w == 450.0 and r.fan_pct == 30.0
    assert r.memory_total_bytes == 24 * 2**30 and r.vram_headroom_bytes == 23 * 2**30
    assert r.temp_slowdown_c == 90.0 and r.temp_shutdown_c == 95.0
    assert r.clock_sm_mhz == 210.0 and r.clock_mem_mhz == 405.0
    assert r.uuid.startswith("GPU-") and r.pci_bus_id == "00000000:1D:00.0" and r.name.startswith("NVIDIA")
    # PCIe is read for one card per round (≈20 ms per call on real cards)
    assert sum(v for (fn, _), v in nv.calls.items() if fn == "nvmlDeviceGetPcieThroughput") == 2
    for _ in range(7):
        src.read()
    assert all(r.pcie_tx_bytes_per_s == 1000 * 1024.0 for r in src.read())
    procs = rs[2].processes
    assert procs[0].server is True and procs[0].used_memory_bytes == 3 * 2**30
    assert procs[1].server is False and procs[1].used_memory_bytes is None
    src.close()
    assert nv.initialized is False


def test_gpu_lost_mid_run_and_back():
    now = [0.0]
    nv = NvmlDouble(4)
    src = NvmlSource(nvml=nv, lost_retry_s=10.0, monotonic=lambda: now[0])
    sampler = GpuSampler(src)
    assert sampler.open()
    bank = SeriesBank()
    bank(sampler.tick())
    nv.lose(2)
    out = sampler.tick()
    assert sampler.latest[2].state == "lost" and sampler.latest[3].state == "ok"
    gpu2 = {s.name: s.value for s in out if s.source == "gpu2"}
    assert gpu2["lost"] == 1.0 and math.isnan(gpu2["power_w"])  # a gap, not 0
    calls = nv.calls[("nvmlDeviceGetHandleByIndex", 2)]
    for _ in range(5):
        sampler.tick()
    assert nv.calls[("nvmlDeviceGetHandleByIndex", 2)] == calls  # not probed every tick
    assert nv.calls[("nvmlDeviceGetPowerUsage", 3)] >= 7  # others keep updating
    nv.recover(2)
    now[0] = 11.0
    sampler.tick()
    assert sampler.latest[2].state == "ok" and sampler.latest[2].power_w == 30.0


def test_mig_card_refuses_utilization():
    nv = NvmlDouble([FakeGpu(0, mig=(1, 1), raises={"nvmlDeviceGetUtilizationRates": "NVMLError_NotSupported"})])
    src = NvmlSource(nvml=nv)
    src.open()
    r = src.read()[0]
    assert r.mig_mode is True and r.util_gpu_pct is None and r.unavailable["util_memory_pct"] == "not supported"
    assert src.session_info().gpus[0].mig_mode is True


def test_transient_error_is_retried_next_tick():
    nv = NvmlDouble([FakeGpu(0, raises={"nvmlDeviceGetTemperature": "NVMLError_Unknown"})])
    src = NvmlSource(nvml=nv)
    src.open()
    assert src.read()[0].temp_gpu_c is None
    del nv.gpus[0].raises["nvmlDeviceGetTemperature"]
    assert src.read()[0].temp_gpu_c == 35.0


def test_no_gpu_and_bad_selection():
    assert NvmlSource(nvml=NvmlDouble(0)).open().state == "no_gpu"
    st = NvmlSource([0, 9], nvml=NvmlDouble(2)).open()
    assert st.state == "error" and "9" in st.message and "2 GPU" in st.message
    st = NvmlSource([1], nvml=NvmlDouble(2))
    st.open()
    assert [r.index for r in st.read()] == [1]


def test_real_pynvml_without_driver_is_a_clear_state():
    """This machine has no NVIDIA driver: the real module must give a state, not an exception."""
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    except pynvml.NVMLError:
        pass
    st = NvmlSource().open()
    assert st.state in ("no_driver", "driver_mismatch", "no_permission", "error") and st.message


def test_sampler_thread_runs_and_stops():
    nv = NvmlDouble(8)
    sampler = GpuSampler(NvmlSource(nvml=nv), interval=0.05)
    bank = SeriesBank()
    sampler.subscribe(bank)
    sampler.start()
    deadline = time.monotonic() + 10
    while sampler.rounds < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    assert not sampler.running and sampler.rounds >= 3
    t, v = bank.get("gpu7", "power_w")
    assert len(t) >= 3 and (v == 30.0).all() and (t[1:] > t[:-1]).all()
    assert bank.last("gpu0", "vram_headroom_bytes")[1] == 23 * 2**30
    assert nv.initialized is False  # nvmlShutdown on stop


def test_throttle_decode():
    assert throttle.decode(None) is None
    assert throttle.decode(0) == []
    assert throttle.decode(0x4 | 0x40 | 0x10000) == ["power cap", "thermal (hardware)", "bit 0x10000"]
    assert throttle.limiting(0x1 | 0x2) == 0 and throttle.limiting(0x8 | 0x1) == 0x8


# ---------------------------------------------------------------------------- the one NVML entry point

def test_read_cards_in_one_session():
    from app.telemetry.nvml import read_cards

    nv = NvmlDouble([FakeGpu(0), FakeGpu(1, name="NVIDIA H100 80GB HBM3", memory_total=80 * 2**30, cc=(9, 0))])
    info = read_cards(nvml=nv)
    assert info.names == ["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"] and info.count == 2
    assert info.memory_gib == [24.0, 80.0] and info.used_gib == [1.0, 1.0] and info.driver == "550.54.15"
    assert info.cards[1].compute_capability == (9, 0)
    one = read_cards([1], nvml=nv)
    assert one.names == ["NVIDIA H100 80GB HBM3"] and one.count == 2 and one.cards[0].index == 1
    with pytest.raises(ValueError, match=r"GPU index \[4\] not present: this machine has 2 GPU"):
        read_cards([4], nvml=nv)
    assert not nv.initialized and nv.calls[("nvmlInit", None)] == nv.calls[("nvmlShutdown", None)] == 3


def test_nvml_session_init_failure_is_a_clear_error():
    from app.telemetry.nvml import NvmlUnavailable, gpu_memory_by_pid, nvml_session, read_cards

    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver found") as e:
        with nvml_session(NvmlDouble(1, init_raises="NVMLError_LibraryNotFound")):
            pass
    assert e.value.state == "no_driver"
    with pytest.raises(NvmlUnavailable) as e:
        read_cards(nvml=NvmlDouble(1, init_raises="NVMLError_LibRmVersionMismatch"))
    assert e.value.state == "driver_mismatch" and "reboot or reload" in e.value.message
    assert gpu_memory_by_pid(NvmlDouble(1, init_raises="NVMLError_DriverNotLoaded")) is None


def test_missing_library_gives_the_clear_error(monkeypatch):
    """nvidia-ml-py not installed: every path says so — no ImportError escapes."""
    from app.planner.cards import NoGpuFound, cards_for
    from app.planner.gpus import gpus_from_nvml
    from app.server.procs import find_leftovers
    from app.telemetry.nvml import NvmlUnavailable, load, nvml_session, read_cards

    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py is not installed") as e:
        load()
    assert e.value.state == "no_driver"
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py is not installed"):
        with nvml_session():
            pass
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py is not installed"):
        read_cards()
    st = NvmlSource().open()
    assert st.state == "no_driver" and "nvidia-ml-py is not installed" in st.message
    assert gpus_from_nvml() == []
    with pytest.raises(NoGpuFound, match="nvidia-ml-py is not installed"):
        cards_for()
    assert all(p.gpu_bytes is None for p in find_leftovers())


def test_procs_and_planner_go_through_the_one_module():
    """The leftover scan and the planner read NVML through app.telemetry.nvml (with the double)."""
    from app.planner.gpus import gpus_from_nvml
    from app.server import procs
    from app.telemetry import nvml as nvml_mod

    assert procs.gpu_memory_by_pid is nvml_mod.gpu_memory_by_pid
    nv = NvmlDouble([FakeGpu(0, processes=[(101, 3 * 2**30), (102, None)]),
                     FakeGpu(1, processes=[(101, 2**30)], returns={"nvmlDeviceGetGraphicsRunningProcesses": [(103, 512)]})])
    assert nvml_mod.gpu_memory_by_pid(nv) == {101: 4 * 2**30, 102: 0, 103: 512}
    assert not nv.initialized
    procs.find_leftovers(nvml=nv)
    assert nv.calls[("nvmlDeviceGetComputeRunningProcesses", 1)] == 2 and not nv.initialized
    nv.lose(1)  # a card that cannot be read: what was read before it
    assert nvml_mod.gpu_memory_by_pid(nv) == {101: 3 * 2**30, 102: 0}
    nv.recover(1)
    assert [g.name for g in gpus_from_nvml(nv)] == ["RTX 4090", "RTX 4090"]
    assert nv.calls[("nvmlDeviceGetMemoryInfo", 0)] == 1 and not nv.initialized


# ---------------------------------------------------------------------------- memory: NVML v2 vs v1

MIB = 2**20
#: the errors nvidia-ml-py raises when the driver has no memory info v2: pynvml.py's
#: nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2) looks up the C function
#: "nvmlDeviceGetMemoryInfo_v2" (_nvmlGetFunctionPointer → NVML_ERROR_FUNCTION_NOT_FOUND
#: on an older libnvidia-ml); a driver that has it may answer ARGUMENT_VERSION_MISMATCH
#: or NOT_SUPPORTED (NVML API reference, nvmlDeviceGetMemoryInfo_v2 return values)
V2_MISSING = [("NVMLError_FunctionNotFound", "function not found"),
              ("NVMLError_ArgumentVersionMismatch", "argument version mismatch"),
              ("NVMLError_NotSupported", "not supported")]


def _card(**kw):
    return FakeGpu(0, memory_total=24 * 2**30, memory_used=1024 * MIB, memory_reserved=512 * MIB, **kw)


def test_double_memory_info_is_shaped_like_both_versions():
    from app.telemetry.nvml import MEMORY_V2_UNAVAILABLE

    nv = NvmlDouble([_card()])
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    v1, v2 = nv.nvmlDeviceGetMemoryInfo(h), nv.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert isinstance(v1, pynvml.c_nvmlMemory_t) and isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert v1.used == 1536 * MIB and v1.total == v1.used + v1.free  # v1: used = allocated + reserved
    assert (v2.used, v2.reserved, v2.free, v2.version) == (1024 * MIB, 512 * MIB, v1.free, pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        nv.nvmlDeviceGetMemoryInfo(h, version=0x01000028)
    # the double raises the real classes, and the app's list names real classes
    assert all(hasattr(pynvml, n) for n in MEMORY_V2_UNAVAILABLE)
    assert sorted(MEMORY_V2_UNAVAILABLE) == sorted(n for n, _ in V2_MISSING)


def test_v2_reading_keeps_reserved_memory_apart():
    nv = NvmlDouble([_card()])
    src = NvmlSource(nvml=nv)
    assert src.open().ok
    (r,) = src.read()
    assert (r.memory_used_bytes, r.memory_reserved_bytes) == (1024 * MIB, 512 * MIB)
    assert r.memory_free_bytes == r.vram_headroom_bytes == 24 * 2**30 - 1536 * MIB
    assert r.busy_bytes == 1536 * MIB and not r.used_includes_reserved
    assert "memory_reserved_bytes" not in r.unavailable
    assert r.memory_note() == ("used 1.00 GiB allocated by processes; 0.50 GiB reserved by the driver, not counted "
                               "as used (NVML memory info v2)")
    names = {s.name: s.value for s in reading_samples(1.0, r)}
    assert names["memory_reserved_bytes"] == 512 * MIB and names["vram_headroom_bytes"] == r.memory_free_bytes
    assert r.compute_capability == (8, 9)
    assert nv.calls[("nvmlDeviceGetMemoryInfo_v2", 0)] == 1


@pytest.mark.parametrize("err,why", V2_MISSING)
def test_without_v2_the_reading_says_used_includes_reserved(err, why):
    from app.telemetry.nvml import read_cards

    nv = NvmlDouble([_card(raises={"nvmlDeviceGetMemoryInfo_v2": err})])
    src = NvmlSource(nvml=nv)
    assert src.open().ok
    for _ in range(3):
        (r,) = src.read()
    assert r.memory_used_bytes == 1536 * MIB and r.memory_reserved_bytes is None  # v1's used, reserved inside
    assert r.used_includes_reserved and r.unavailable["memory_reserved_bytes"] == why
    assert r.vram_headroom_bytes == 24 * 2**30 - 1536 * MIB and r.busy_bytes == 1536 * MIB
    note = r.memory_note()
    assert "includes memory the driver reserves" in note and f"NVML memory info v2 is not available ({why})" in note
    # the driver does not grow v2 while it runs: asked once, then v1 only
    assert nv.calls[("nvmlDeviceGetMemoryInfo_v2", 0)] == 1 and nv.calls[("nvmlDeviceGetMemoryInfo", 0)] >= 4
    (c,) = read_cards(nvml=nv).cards
    assert (c.memory_used_bytes, c.memory_reserved_bytes, c.reserved_unavailable) == (1536 * MIB, None, why)
    assert c.busy_bytes == 1536 * MIB


def test_an_nvidia_ml_py_without_v2_and_a_passing_v2_error():
    from app.telemetry.nvml import read_cards

    nv = NvmlDouble([_card()])
    del nv.nvmlMemory_v2  # nvidia-ml-py from before memory info v2
    (c,) = read_cards(nvml=nv).cards
    assert c.reserved_unavailable == "this nvidia-ml-py has no nvmlMemory_v2" and c.memory_used_bytes == 1536 * MIB
    assert nv.calls[("nvmlDeviceGetMemoryInfo_v2", 0)] == 0
    # any other error of the v2 call is this tick's, not "no v2": the memory is missing once, v2 is asked again
    nv = NvmlDouble([_card(raises={"nvmlDeviceGetMemoryInfo_v2": "NVMLError_Unknown"})])
    src = NvmlSource(nvml=nv)
    assert src.open().ok
    (r,) = src.read()
    assert r.memory_used_bytes is None and r.unavailable["memory_used_bytes"] == "unknown error"
    assert "memory_reserved_bytes" in r.unavailable and not r.used_includes_reserved and r.memory_note() == ""
    del nv.gpus[0].raises["nvmlDeviceGetMemoryInfo_v2"]
    (r,) = src.read()
    assert r.memory_reserved_bytes == 512 * MIB and nv.calls[("nvmlDeviceGetMemoryInfo_v2", 0)] == 2
    # a card lost during the v2 call is lost, not "without v2"
    nv = NvmlDouble([_card(raises={"nvmlDeviceGetMemoryInfo_v2": "NVMLError_GpuIsLost"})])
    src = NvmlSource(nvml=nv)
    assert src.open().ok
    assert src.read()[0].state == "lost"


def test_planner_sees_the_same_free_memory_under_either_version():
    """vLLM's start-up check compares its request with the free memory cudaMemGetInfo
    reports (vllm/utils/mem_utils.py MemorySnapshot.measure: ``free_memory, total_memory
    = torch.accelerator.get_memory_info(device)``; vllm/v1/worker/utils.py request_memory:
    "Free memory on device (…) on startup is less than …", 0.32.0) — the driver's
    reservation is not free either — so the planner holds total − free under v1 and v2."""
    from app.planner.gpus import gpus_from_nvml

    v2 = gpus_from_nvml(NvmlDouble([_card()]))
    v1 = gpus_from_nvml(NvmlDouble([_card(raises={"nvmlDeviceGetMemoryInfo_v2": "NVMLError_FunctionNotFound"})]))
    assert v1[0].busy_gib == v2[0].busy_gib == 1.5


def test_cli_telemetry_table_shows_reserved_apart_or_says_why_not():
    from app.cli.telemetry import render
    from app.telemetry.hub import Telemetry

    nv = NvmlDouble([_card(), FakeGpu(1, memory_total=24 * 2**30, memory_used=2**30, memory_reserved=512 * MIB,
                                      raises={"nvmlDeviceGetMemoryInfo_v2": "NVMLError_FunctionNotFound"})])
    tel = Telemetry(gpu_source=NvmlSource(nvml=nv), host=False)
    assert tel.gpu.open()
    tel.gpu.tick()
    out = render(tel, None)
    tel.gpu.teardown()
    lines = out.splitlines()
    assert "reserved" in lines[2]
    row0 = next(line for line in lines if line.lstrip().startswith("0 "))
    row1 = next(line for line in lines if line.lstrip().startswith("1 "))
    assert "1.0/24.0 GiB" in row0 and "0.5 GiB" in row0
    assert "1.5/24.0 GiB" in row1 and "in used*" in row1
    assert ("* GPU 1: used 1.50 GiB includes memory the driver reserves: NVML memory info v2 is not available "
            "(function not found)") in out
    assert "* GPU 0" not in out
