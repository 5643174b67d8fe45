"""Peer-to-peer (issue 16, kind 6) and the parallel-layout fix search (kind 7).

P2P inputs are written from vLLM's
vllm/distributed/device_communicators/custom_all_reduce.py (CustomAllreduce.__init__,
the same three warnings in 0.10.2, 0.11.0, 0.32.0 and 0.33.0) and from NCCL 2.27/2.28
src/graph/paths.cc (ncclGetLevel, ncclTopoCheckP2p) and src/transport/p2p.cc
(p2pCanConnect); the IOMMU/ACS hang from NCCL's troubleshooting guide ("PCI Access
Control Services"). The layout fix search ranks by the planner's own step-time model
(app.planner.plan.peak_output_tps).
"""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.config import ServerConfig
from app.planner.checks import custom_all_reduce_state, nccl_p2p_forced, parallel_layouts, tp_divides
from app.planner.gpus import lookup_gpu
from app.planner.models import ModelArch, from_catalog
from app.planner.pcie import HostPcie, read_host_pcie
from app.planner.plan import Workload, apply_fix, peak_output_tps, plan
from app.planner.render import render_plan

VERSIONS = ["0.10.2", "0.11.0", "0.32.0", "0.33.0"]
IOMMU_ON = HostPcie("translated", None, "test")

#: a Llama-shaped 3 B model whose heads divide by 3 (24 heads, 6 KV heads)
THREE_WAY = ModelArch.from_config({
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 28, "hidden_size": 3072,
    "num_attention_heads": 24, "num_key_value_heads": 6, "intermediate_size": 8192, "vocab_size": 32000,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}, "three-way")


def _plan(cfg, gpu, n, model=None, version="0.32.0", host=None, workload=None):
    return plan(cfg, [lookup_gpu(gpu)] * n, model or from_catalog("Llama-3-8B"), workload or Workload.of(512, 128),
                vllm_version=version, use_calibration=False, host=host)


def _finding(p, code):
    return next((f for f in p.findings if f.problem == code), None)


# ---------------------------------------------------------------------- kind 6: P2P
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("gpu,tp,model,said", [
    # custom_all_reduce.py: `world_size > 2 and not fully_connected` (PCIe-only cards)
    ("RTX 4090", 4, None, "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"),
    ("RTX 5090", 8, None, "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"),
    # two cards pass that test and fail `_can_p2p` (the driver's can_device_access_peer)
    ("RTX 4090", 2, None, "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test "
                          "failed"),
    # world size not in _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]
    ("RTX 4090", 3, THREE_WAY, "Custom allreduce is disabled due to an unsupported world size: 3"),
])
def test_no_p2p_is_information_with_the_line_vllm_logs(version, gpu, tp, model, said):
    p = _plan(ServerConfig(model="m", tensor_parallel_size=tp), gpu, tp, model, version)
    f = _finding(p, "no_p2p")
    assert f.verdict == "info" and f.fix is None and said in f.message
    assert p.verdict == "ok" and p.problem is None and p.fix is None  # info never changes the verdict
    assert custom_all_reduce_state(p) == (False, said)
    d = p.as_dict()
    assert d["verdict"] == "ok" and d["fix"] is None
    assert [x["verdict"] for x in d["findings"] if x["problem"] == "no_p2p"] == ["info"]


def test_no_p2p_with_the_old_workaround_or_a_forcing_variable_stays_information():
    m = from_catalog("Llama-3-8B")
    done = _plan(ServerConfig(model="m", tensor_parallel_size=2, disable_custom_all_reduce=True,
                              env={"NCCL_P2P_DISABLE": "1"}), "RTX 4090", 2, m)
    f = _finding(done, "no_p2p")
    assert f.verdict == "info" and "NCCL_P2P_DISABLE=1 changes nothing" in f.message and "logs" not in f.message
    # NCCL 2.27 paths.cc: NCCL_P2P_LEVEL only moves the distance cut-off, the NVML test stays
    # (NCCL_IGNORE_DISABLED_P2P=2 skips it), and p2p.cc still asks cudaDeviceCanAccessPeer
    for env in ({"NCCL_P2P_LEVEL": "SYS"}, {"NCCL_IGNORE_DISABLED_P2P": "2"}):
        p = _plan(ServerConfig(model="m", tensor_parallel_size=2, env=env), "RTX 4090", 2, m, host=IOMMU_ON)
        f = _finding(p, "no_p2p")
        assert f.verdict == "info" and p.verdict == "ok", p.findings
        assert f"{next(iter(env))}={next(iter(env.values()))} cannot turn P2P on here" in f.message


def test_single_card_and_cpu_build_have_no_p2p_finding():
    assert _finding(_plan(ServerConfig(model="m"), "RTX 4090", 1), "no_p2p") is None


@pytest.mark.parametrize("host", [HostPcie("translated", None, "t"), HostPcie("passthrough", None, "t"),
                                  HostPcie("off", True, "t"), HostPcie(None, True, "t")])
def test_p2p_over_pcie_on_an_iommu_or_acs_host_is_a_warning_with_the_hang_fix(host):
    """tests/cases/launch/nccl-p2p-hang.yaml on a host whose IOMMU/ACS redirects P2P: the
    plan warns before the launch, with the fix the diagnosis offers after the hang."""
    cfg = ServerConfig(model="m", tensor_parallel_size=2)
    p = _plan(cfg, "RTX 6000 Ada", 2, host=host)
    assert p.verdict == "warn" and p.problem == "p2p_hang_risk"
    # TP 2 with P2P: vLLM's custom all-reduce would run (custom_all_reduce.py _can_p2p passes)
    assert p.fix == {"env": {"NCCL_P2P_DISABLE": "1"}, "disable_custom_all_reduce": True}
    assert "even a hang" in p.primary.message and host.source in p.primary.message
    assert _plan(apply_fix(cfg, p.fix), "RTX 6000 Ada", 2, host=host).verdict == "ok"


def test_hang_risk_needs_a_redirecting_host_and_pcie_p2p():
    cfg = ServerConfig(model="m", tensor_parallel_size=2)
    for host in (None, HostPcie("off", None, "t"), HostPcie("off", False, "t"), HostPcie(None, None, "t")):
        assert _plan(cfg, "RTX 6000 Ada", 2, host=host).verdict == "ok"
    # NVLink between all cards (SXM): P2P does not cross the PCIe bridges
    assert _plan(cfg, "H100 SXM", 2, host=IOMMU_ON).verdict == "ok"
    # more than two PCIe cards: vLLM already turns custom all-reduce off, NCCL's P2P remains
    p = _plan(ServerConfig(model="m", tensor_parallel_size=4), "L40S", 4, host=IOMMU_ON)
    assert p.problem == "p2p_hang_risk" and p.fix == {"env": {"NCCL_P2P_DISABLE": "1"}}
    # pipeline parallel only: NCCL send/recv between the stages, no all-reduce
    p = _plan(ServerConfig(model="m", pipeline_parallel_size=2), "L40S", 2, host=IOMMU_ON)
    assert p.problem == "p2p_hang_risk" and p.fix == {"env": {"NCCL_P2P_DISABLE": "1"}}


@pytest.mark.parametrize("level", ["SYS", "PHB", "3", "5"])
def test_forcing_p2p_through_the_root_complex_on_an_iommu_host_is_an_error(level):
    """NCCL_P2P_LEVEL past PXB (NCCL's default cut-off; old numbers 3–5 → PHB/SYS)."""
    cfg = ServerConfig(model="m", tensor_parallel_size=2, env={"NCCL_P2P_LEVEL": level})
    p = _plan(cfg, "RTX 6000 Ada", 2, host=IOMMU_ON)
    assert p.verdict == "error" and p.problem == "p2p_forced" and f"NCCL_P2P_LEVEL={level}" in p.primary.message
    assert p.fix == {"env": {"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": None}, "disable_custom_all_reduce": True}
    fixed = apply_fix(cfg, p.fix)
    assert "NCCL_P2P_LEVEL" not in fixed.env and _plan(fixed, "RTX 6000 Ada", 2, host=IOMMU_ON).verdict == "ok"


def test_what_forces_nccl_p2p():
    assert nccl_p2p_forced({"NCCL_P2P_LEVEL": "SYS"}) == "NCCL_P2P_LEVEL=SYS"
    assert nccl_p2p_forced({"NCCL_P2P_LEVEL": "4"}) == "NCCL_P2P_LEVEL=4"
    # within NCCL's default, a level NCCL's strcmp does not know, or P2P disabled (read first)
    for env in ({"NCCL_P2P_LEVEL": "PXB"}, {"NCCL_P2P_LEVEL": "NVL"}, {"NCCL_P2P_LEVEL": "2"},
                {"NCCL_P2P_LEVEL": "sys"}, {"NCCL_P2P_LEVEL": "SYS", "NCCL_P2P_DISABLE": "1"},
                {"NCCL_P2P_DISABLE": "0"}, {}):
        assert nccl_p2p_forced(env) is None, env


def test_read_host_pcie_without_root(tmp_path):
    groups, cmdline = tmp_path / "iommu_groups", tmp_path / "cmdline"
    cmdline.write_text("BOOT_IMAGE=/vmlinuz quiet amd_iommu=on iommu=pt\n")
    assert read_host_pcie(groups, cmdline).iommu is None  # no sysfs: unknown, not "off"
    groups.mkdir()
    h = read_host_pcie(groups, cmdline)
    assert h.iommu == "off" and not h.redirects_p2p and "amd_iommu=on iommu=pt" in h.source
    for i, t in enumerate(["identity", "identity"]):
        (groups / str(i)).mkdir()
        (groups / str(i) / "type").write_text(t + "\n")
    h = read_host_pcie(groups, cmdline)
    assert h.iommu == "passthrough" and h.redirects_p2p and "2 groups" in h.source
    (groups / "2").mkdir()
    (groups / "2" / "type").write_text("DMA-FQ\n")
    (groups / "3").mkdir()  # an older kernel: no type file, the domain translates
    h = read_host_pcie(groups, tmp_path / "no-cmdline")
    assert h.iommu == "translated" and h.acs is None and "4 groups" in h.source and "DMA-FQ" in h.source


def test_cli_plan_reads_iommu_and_acs_flags_and_prints_information(capsys):
    base = ["plan", "--model", "Llama-3-8B", "--tensor-parallel-size", "2", "--vllm-version", "0.32.0"]
    assert main(base + ["--gpu", "RTX 6000 Ada", "--count", "2", "--iommu", "translated"]) == 0
    out = capsys.readouterr().out
    assert "verdict: WARN — p2p_hang_risk" in out and "NCCL_P2P_DISABLE=1 --disable-custom-all-reduce" in out
    assert "host PCIe: IOMMU on, translated" in out
    assert main(base + ["--gpu", "RTX 6000 Ada", "--count", "2", "--acs", "on", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["problem"] == "p2p_hang_risk" and d["host"]["acs"] is True
    assert main(base + ["--gpu", "RTX 4090", "--count", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == "ok" and d["problem"] is None and d["fix"] is None and d["host"] is None
    assert [f["verdict"] for f in d["findings"] if f["problem"] == "no_p2p"] == ["info"]
    assert main(base + ["--gpu", "RTX 4090", "--count", "2"]) == 0
    out = capsys.readouterr().out
    assert "info  no_p2p" in out and "fix: no option change" not in out


# ---------------------------------------------------------------------- kind 7: layouts
def test_layouts_are_every_split_of_the_cards():
    m = from_catalog("Llama-3-70B")  # 64 heads, 8 KV heads, 80 layers
    p = _plan(ServerConfig(model="m", tensor_parallel_size=3, quantization="awq", max_model_len=8192),
              "RTX 4090", 8, m)
    got = {(f.get("tensor_parallel_size", 3), f.get("pipeline_parallel_size", 1)) for f in parallel_layouts(p)}
    want = {(t, q) for t in range(1, 9) for q in range(1, 9) if t * q <= 8 and tp_divides(t, 64, 8)} - {(3, 1)}
    assert got == want and (1, 8) in got and (4, 2) in got
    assert not any("data_parallel_size" in f for f in parallel_layouts(p))  # one engine stays one engine
    # with data parallel replicas already, every DP count is a split too
    q = _plan(ServerConfig(model="m", tensor_parallel_size=3, data_parallel_size=2, quantization="awq",
                           max_model_len=8192), "RTX 4090", 8, m)
    dps = {(f.get("tensor_parallel_size", 3), f.get("pipeline_parallel_size", 1), f.get("data_parallel_size", 2))
           for f in parallel_layouts(q)}
    assert (2, 1, 4) in dps and (4, 1, 1) in dps and (8, 1, 1) in dps and all(t * p * d <= 8 for t, p, d in dps)
    more = parallel_layouts(_plan(ServerConfig(model="m", tensor_parallel_size=2), "RTX 4090", 8, m),
                            more_cards_per_replica=True)
    assert more and all(f.get("tensor_parallel_size", 2) * f.get("pipeline_parallel_size", 1) > 2 for f in more)


@pytest.mark.parametrize("server,n,code", [
    ({"tensor_parallel_size": 3, "quantization": "awq"}, 8, "tp_not_divisor_of_heads"),
    ({"tensor_parallel_size": 16, "quantization": "awq"}, 8, "not_enough_gpus"),
    ({"tensor_parallel_size": 1}, 8, "weights_do_not_fit"),  # 70B bf16 on one 4090
    ({"tensor_parallel_size": 4, "data_parallel_size": 3, "quantization": "awq"}, 8, "not_enough_gpus"),
])
def test_layout_fix_is_the_fastest_that_passes_every_check(server, n, code):
    m = from_catalog("Llama-3-70B")
    cfg = ServerConfig(model="m", max_model_len=8192, **server)
    wl = Workload.of(512, 128)
    p = _plan(cfg, "RTX 4090", n, m, workload=wl)
    f = _finding(p, code)
    assert f.verdict == "error" and f.alternatives and p.problem == code
    assert f.fix == f.alternatives[0][0]
    tps = [t for _, t in f.alternatives]
    assert tps == sorted(tps, reverse=True) and len(f.alternatives) >= 2
    for fix, t in f.alternatives:
        q = _plan(apply_fix(cfg, fix), "RTX 4090", n, m, workload=wl)
        assert q.verdict != "error", (fix, q.problems())  # every offered layout passes every check
        assert all(r.kv_tokens > 0 for r in q.ranks)  # and fits the cards
        assert peak_output_tps(q) == pytest.approx(t)
    assert "predicted peak" in render_plan(p)


def test_a_layout_that_does_not_fit_the_cards_is_never_offered():
    """The trial: 70B in bf16 (131 GiB) with TP 3 on three 24 GiB cards. TP 2 divides the
    heads but does not fit (no KV cache) — it used to be offered because the unfixed plan
    already had no_kv_cache_memory. No split of three 24 GiB cards holds 131 GiB."""
    m = from_catalog("Llama-3-70B")
    p = _plan(ServerConfig(model="m", tensor_parallel_size=3, max_model_len=8192), "RTX 4090", 3, m)
    f = _finding(p, "tp_not_divisor_of_heads")
    assert f.fix is None and f.alternatives == [] and p.fix is None
    assert "no option change fixes it" in render_plan(p)
    # in AWQ (37 GiB) the same three cards hold it: TP 2 (two cards) beats the pipelines
    cfg = ServerConfig(model="m", tensor_parallel_size=3, quantization="awq", max_model_len=8192)
    p = _plan(cfg, "RTX 4090", 3, m)
    assert {"tensor_parallel_size": 1, "pipeline_parallel_size": 3} in [a for a, _ in p.primary.alternatives]
    assert _plan(apply_fix(cfg, p.fix), "RTX 4090", 3, m).verdict != "error"


@pytest.mark.parametrize("version,said", [
    # vllm/v1/engine/utils.py get_device_indices (0.10.2, 0.11.0)
    ("0.10.2", "Error setting CUDA_VISIBLE_DEVICES: local range: [4, 8)"),
    ("0.11.0", "Error setting CUDA_VISIBLE_DEVICES: local range: [4, 8)"),
    # vllm/v1/worker/gpu_worker.py init_device (0.32.0; 0.33.0 assumed the same): on CUDA the
    # engine no longer sets CUDA_VISIBLE_DEVICES per DP rank, the worker's device check stops it
    ("0.32.0", "DP adjusted local rank 6 is out of bounds for 6 devices."),
    ("0.33.0", "DP adjusted local rank 6 is out of bounds for 6 devices."),
])
def test_data_parallel_past_the_cards_names_vllms_wording(version, said):
    m = from_catalog("Llama-3-70B")
    cfg = ServerConfig(model="m", tensor_parallel_size=4, data_parallel_size=2, quantization="awq",
                       max_model_len=8192)
    p = _plan(cfg, "RTX 4090", 6, m, version)
    assert p.problem == "not_enough_gpus" and said in p.primary.message
    # vllm/config/parallel.py: one replica larger than the cards keeps its own wording
    q = _plan(ServerConfig(model="m", tensor_parallel_size=8, quantization="awq", max_model_len=8192),
              "RTX 4090", 4, m, version)
    assert "World size (8) is larger than the number of available GPUs (4)" in q.primary.message


def test_data_parallel_plans_every_replica_and_adds_their_throughput():
    m = from_catalog("Llama-3-8B")
    one = _plan(ServerConfig(model="m", tensor_parallel_size=2), "RTX 4090", 2, m,
                workload=Workload.of(512, 128, (1, 8, 64)))
    two = _plan(ServerConfig(model="m", tensor_parallel_size=2, data_parallel_size=2), "RTX 4090", 4, m,
                workload=Workload.of(512, 128, (2, 16, 128)))
    assert [r.rank for r in two.ranks] == [0, 1, 2, 3] and two.kv_cache_tokens == one.kv_cache_tokens
    assert two.workload_concurrency == 2 * one.workload_concurrency
    # N users on one engine ≈ 2N on two (the step-level engine: each replica its own
    # scheduler, users in turn; the lengths are drawn ±25 % per request, so not exactly)
    for a, b in zip(one.curve.points, two.curve.points):
        assert b.output_tps == pytest.approx(2 * a.output_tps, rel=0.05)
        assert b.tpot_p99_s == pytest.approx(a.tpot_p99_s, rel=0.1) and b.running == 2 * a.running
    assert two.curve.capacity == 2 * one.curve.capacity
    assert peak_output_tps(two) == pytest.approx(2 * peak_output_tps(one))
    # an odd level splits 2 + 1: the mean TTFT lies between one engine's at 1 and at 2 users
    odd = _plan(ServerConfig(model="m", tensor_parallel_size=2, data_parallel_size=2), "RTX 4090", 4, m,
                workload=Workload.of(512, 128, (3,)))
    lo = _plan(ServerConfig(model="m", tensor_parallel_size=2), "RTX 4090", 2, m, workload=Workload.of(512, 128, (1, 2)))
    pt = odd.curve.points[0]
    assert pt.concurrency == 3 and pt.running == 3
    assert pt.output_tps == pytest.approx(lo.curve.points[0].output_tps + lo.curve.points[1].output_tps, rel=0.05)


# ---------------------------------------------------------------------- rigs of several hosts (issue 21)
def test_tp_across_hosts_warns_with_tp_within_a_host_and_pp_across_as_the_fix():
    """vLLM's distributed serving guide: TP = GPUs per node, PP = nodes. A TP group wider
    than a host is a warning whose fix keeps TP within a host; TP within a host is none."""
    from app.planner.gpus import rig_layout
    cards = [lookup_gpu("RTX 4090")] * 4
    m = from_catalog("Llama-3-8B")
    p = plan(ServerConfig(model="Llama-3-8B", tensor_parallel_size=4), cards, m, Workload.of(512, 128),
             use_calibration=False, rig=rig_layout(2, 2, "25gbe"), predict=False)
    f = _finding(p, "tp_spans_hosts")
    assert f is not None and f.verdict == "warn"
    assert "spans 2 hosts" in f.message and "25 GbE" in f.message
    assert f.fix == {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in f.message
    fixed = plan(apply_fix(p.config, f.fix), cards, m, Workload.of(512, 128), use_calibration=False,
                 rig=rig_layout(2, 2, "25gbe"), predict=False)
    assert _finding(fixed, "tp_spans_hosts") is None
    one_host = plan(p.config, cards, m, Workload.of(512, 128), use_calibration=False, predict=False)
    assert _finding(one_host, "tp_spans_hosts") is None
    assert p.as_dict()["rig"] == {"hosts": 2, "cards_per_host": 2, "link": "25gbe", "tp_hosts": 2,
                                  "link_share": p.link_share}


def test_a_sim_profile_of_several_hosts_is_planned_with_its_link():
    """A profile's ``sim:`` rig with ``hosts``/``link`` is planned (app.run.profile_run)
    with the same layout the sim serves: stage sends across hosts over the link."""
    from app.profiles.io import parse_profile
    from app.profiles.model import HardwareFingerprint
    from app.run.profile_run import plan_profile

    prof = parse_profile("name: pp over hosts\nengine: sim\nsim: {gpu: RTX 4090, count: 4, hosts: 4, link: 10GbE}\n"
                         "server: {model: Llama-3-8B, pipeline_parallel_size: 4, max_model_len: 4096}\n"
                         "ramp: {levels: [1], prompt_tokens: 64, output_tokens: 16}\n")
    p = plan_profile(prof, "0.32.0")
    assert p.rig is not None and (p.rig.hosts, p.rig.cards_per_host, p.rig.link.name) == (4, 1, "10gbe")
    assert [p.perf.boundary_crosses_hosts(i) for i in range(3)] == [True] * 3
    hw = HardwareFingerprint(gpu="RTX 4090", count=4, hosts=4, link="10gbe")
    assert hw.describe().startswith("4 hosts × 1× RTX 4090 (10gbe)")
    assert HardwareFingerprint(gpu="RTX 4090", count=4).rig_layout() is None
