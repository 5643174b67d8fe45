"""The Plan tab lists information findings like the others, after errors and warnings,
without changing the verdict line (issue 16, kind 6)."""
from __future__ import annotations

from PySide6.QtWidgets import QFrame, QLabel, QPushButton

from app.config import ServerConfig
from app.planner.gpus import lookup_gpu
from app.planner.models import from_catalog
from app.planner.pcie import HostPcie
from app.planner.plan import Workload, plan
from widgets.plan_panel import PlanPanel


def _panel(qtbot, p):
    w = PlanPanel()
    qtbot.addWidget(w)
    w.show_plan(p)
    return w


def _rows(w):
    return [w.findings_box.itemAt(i).widget().objectName() for i in range(w.findings_box.count())]


def test_information_is_listed_and_the_verdict_stays_fits(qtbot):
    m = from_catalog("Llama-3-70B")
    cfg = ServerConfig(model="m", tensor_parallel_size=4, quantization="awq", max_model_len=8192)
    p = plan(cfg, [lookup_gpu("RTX 4090")] * 4, m, Workload.of(512, 128), use_calibration=False)
    w = _panel(qtbot, p)
    assert w.verdict.text().startswith("Fits")
    row = w.findChild(QFrame, "finding_no_p2p")
    assert row is not None and row.findChild(QPushButton) is None  # nothing to apply
    text = row.findChild(QLabel).text()
    assert text.startswith("ℹ") and "more than two PCIe-only GPUs" in text


def test_information_comes_after_errors_and_warnings(qtbot):
    m = from_catalog("Llama-3-70B")
    cfg = ServerConfig(model="m", tensor_parallel_size=3, quantization="awq", max_model_len=8192,
                       gpu_memory_utilization=0.99)
    p = plan(cfg, [lookup_gpu("RTX 4090")] * 4, m, Workload.of(512, 128), use_calibration=False)
    w = _panel(qtbot, p)
    rows = _rows(w)
    assert rows.index("finding_tp_not_divisor_of_heads") < rows.index("finding_no_p2p")
    assert rows[-1] == "finding_no_p2p"
    btn = w.findChild(QPushButton, "fix_tp_not_divisor_of_heads")
    assert btn is not None and "predicted" in btn.toolTip() and "output tok/s" in btn.toolTip()


def test_hang_risk_on_an_iommu_host_is_a_warning_with_apply_fix(qtbot):
    cfg = ServerConfig(model="m", tensor_parallel_size=2)
    p = plan(cfg, [lookup_gpu("RTX 6000 Ada")] * 2, from_catalog("Llama-3-8B"), Workload.of(512, 128),
             use_calibration=False, host=HostPcie("translated", None, "test"))
    w = _panel(qtbot, p)
    assert w.verdict.text().startswith("Will run, with warnings")
    fixed = []
    w.apply_fix.connect(fixed.append)
    w.findChild(QPushButton, "fix_p2p_hang_risk").click()
    assert fixed == [{"env": {"NCCL_P2P_DISABLE": "1"}, "disable_custom_all_reduce": True}]


def test_the_live_plan_reads_this_machines_iommu_for_its_own_cards_only(monkeypatch):
    """compute_plan: NVML readings (this machine's cards) → this machine's IOMMU
    (app.planner.pcie.read_host_pcie); a sim rig → no host."""
    import widgets.plan_panel as pp
    from app.telemetry.gpu_source import GpuReading

    monkeypatch.setattr(pp, "read_host_pcie", lambda: HostPcie("translated", None, "this machine"))
    cfg = ServerConfig(model="Llama-3-8B", tensor_parallel_size=2, gpus=[0, 1])
    rs = [GpuReading(index=i, name="NVIDIA RTX 6000 Ada Generation", memory_total_bytes=48 * 2**30,
                     memory_used_bytes=0) for i in range(2)]
    p = pp.compute_plan(pp.PlanInputs(cfg, "vllm", "", 1, rs, 512, 128, None, "0.32.0"))
    assert p.host.source == "this machine" and p.problem == "p2p_hang_risk"
    sim = pp.compute_plan(pp.PlanInputs(cfg, "sim", "RTX 6000 Ada", 2, [], 512, 128, None, "0.32.0"))
    assert sim.host is None and sim.verdict == "ok"
