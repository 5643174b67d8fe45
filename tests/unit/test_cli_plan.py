"""``vllm-dyno plan``: the seed scenario, mixed cards, JSON, bad input."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.planner.gpus import load_catalog

SEED = ["plan", "--model", "Llama-3-70B", "--gpu", "RTX 5090", "--quantization", "awq", "--max-model-len", "8192",
        "--prompt-tokens", "512", "--output-tokens", "128", "--vllm-version", "0.32.0"]


@pytest.mark.parametrize("n", [4, 8])
def test_seed_scenario_table_and_verdict(n, capsys):
    rc = main(SEED + ["--count", str(n), "--tensor-parallel-size", str(n), "--levels", "1,10,30"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("RTX 5090") >= n and "KV cache size" in out and "knee:" in out
    # no P2P on GeForce cards is information (vLLM 0.32.0 custom_all_reduce.py: more than two PCIe-only GPUs)
    assert "verdict: OK" in out and "info  no_p2p" in out and "more than two PCIe-only GPUs" in out
    assert "327,680 B/token" in out


def test_unknown_gpu_and_model(capsys):
    with pytest.raises(SystemExit, match="not in the catalog"):
        main(["plan", "--model", "Llama-3-8B", "--gpu", "Voodoo 5"])
    assert main(["plan", "--model", "nobody/None-1B", "--gpu", "RTX 4090"]) == 2
    assert "catalog" in capsys.readouterr().err
    # an unknown card: memory *and* compute capability, never an assumed capability
    with pytest.raises(SystemExit, match=r"--gpu 'Voodoo 5'.*compute capability is not known.*Voodoo 5:24:8\.9"):
        main(["plan", "--model", "Llama-3-8B", "--gpu", "Voodoo 5:24"])
    with pytest.raises(SystemExit, match=r"'86' is not a compute capability"):
        main(["plan", "--model", "Llama-3-8B", "--gpu", "Voodoo 5:24:86"])
    rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "Voodoo 5:24:8.6", "--vllm-version", "0.32.0"])
    out = capsys.readouterr().out
    assert rc == 0 and "assumed figures" in out and "Voodoo 5: bandwidth_gbs" in out
    assert "cc" not in out.split("assumed figures")[1]
    # the same card at 7.5 cannot run bfloat16: the capability reaches the checks
    rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "Voodoo 5:24:7.5", "--dtype", "bfloat16", "--json",
               "--vllm-version", "0.32.0"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 1 and d["verdict"] == "error" and d["problem"] == "dtype_unsupported_by_gpu"


def test_list_gpus_shows_the_catalog_without_a_model(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--list-gpus"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    lines = out.splitlines()
    hint = next(i for i, line in enumerate(lines) if "NAME:GIB:CC" in line)
    rows = {line.split("  ")[0].strip(): line for line in lines[1:hint]}
    assert set(rows) == set(load_catalog())
    assert "Quadro RTX 8000" in rows and " 7.5 " in rows["Quadro RTX 8000"] and "NVIDIA L40S" in rows["L40S"]
    # then the inter-host links: name, line rate, GB/s, latency
    from app.planner.gpus import load_links
    links = [line for line in lines[hint + 1:] if line.strip() and not line.startswith("link ")]
    assert [line.split(" — ")[0] for line in links] == list(load_links())
    assert "ib-hdr200 — InfiniBand HDR 200 Gb/s" in links[3] and "23.5" in links[3] and "2.7 µs" in links[3]


def test_plan_parser_takes_every_vllm_option():
    """config → argv → `plan`'s parser → config: equal for every declared option."""
    from app.cli import build_parser
    from app.config import ServerConfig
    from app.cli.common import config_from_args
    from tests.unit.test_config import ALL_OPTIONS

    cfg = ServerConfig(model="Llama-3-70B", **ALL_OPTIONS)
    ns = build_parser().parse_args(["plan", "--model", cfg.model, *cfg.option_argv(), "--gpu", "RTX 5090"])
    assert config_from_args(ns) == cfg


def test_plan_rejects_bad_option_values_naming_the_field():
    with pytest.raises(SystemExit, match="gpu_memory_utilization"):
        main(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", "--gpu-memory-utilization", "1.5"])


# ---------------------------------------------------------------------- rig what-if (issue 21)
def test_rig_what_if_compares_hosts_with_one_host_of_the_same_cards(capsys):
    """``--nodes 1,2 --link 10gbe``: 1 host × 1 card; 2 hosts × 1 card (PP 2 across, DP 2)
    and 1 host × 2 cards (TP 2, DP 2). DP replicas send nothing over the network (share
    0, the same users on one host or two); PP across 10 GbE gives the link a share, and
    its prediction is the planner's own for that layout and rig."""
    from app.config import ServerConfig
    from app.planner.gpus import lookup_gpu, rig_layout
    from app.planner.models import from_catalog
    from app.planner.plan import Workload, plan
    from app.hosts.whatif import DEFAULT_RIG_SLO

    rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", "--nodes", "1,2", "--link", "10gbe",
               "--fixed-lengths", "--vllm-version", "0.32.0", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    rows = {(r["hosts"], r["cards_per_host"], r["tensor_parallel_size"], r["pipeline_parallel_size"],
             r["data_parallel_size"]): r for r in d["rows"]}
    assert list(rows) == [(1, 1, 1, 1, 1), (2, 1, 1, 2, 1), (2, 1, 1, 1, 2), (1, 2, 2, 1, 1), (1, 2, 1, 1, 2)]
    pp = rows[2, 1, 1, 2, 1]
    assert pp["link"] == "10gbe" and 0 < pp["link_share"] < 1
    assert rows[2, 1, 1, 1, 2]["link_share"] == 0 and rows[2, 1, 1, 1, 2]["users"] == rows[1, 2, 1, 1, 2]["users"]
    assert rows[1, 2, 2, 1, 1]["link"] is None and rows[1, 2, 2, 1, 1]["link_share"] == 0
    want = plan(ServerConfig(model="Llama-3-8B", pipeline_parallel_size=2), [lookup_gpu("RTX 4090")] * 2,
                from_catalog("Llama-3-8B"), Workload.of(512, 128, length_spread=0.0, slo=DEFAULT_RIG_SLO),
                vllm_version="0.32.0", rig=rig_layout(2, 1, "10gbe"))
    assert pp["users"] == want.capacity.users and pp["output_tps"] == want.capacity.output_tps


def test_rig_what_if_table_and_a_model_that_needs_the_hosts(capsys):
    """A 70B AWQ model does not fit one 24-GB card: its 1 × 1 row says so, PP over two
    hosts runs, and no DP row is offered where a replica does not fit a host."""
    rc = main(["plan", "--model", "Llama-3-70B", "--quantization", "awq", "--max-model-len", "8192", "--gpu",
               "RTX 4090", "--nodes", "1,2", "--link", "ib-hdr200", "--vllm-version", "0.32.0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = [x for x in out.splitlines() if "host" in x and "×" in x]
    assert "does not run" in lines[0] and lines[0].lstrip().startswith("1 host × 1 card")
    assert any(x.lstrip().startswith("2 hosts × 1 card, InfiniBand HDR 200 Gb/s") and "PP 2" in x
               and "does not run" not in x for x in lines)
    assert not any("DP 2" in x for x in lines)
    assert "TTFT p99 ≤ 2 s and TPOT p99 ≤ 100 ms" in out


def test_one_layout_on_several_hosts_is_a_plan_with_the_rig_and_the_tp_warning(capsys):
    """``--nodes 4 --link 10gbe --tensor-parallel-size 4``: that layout on 4 hosts × 1
    card — the plan names the rig and the link's share, and warns that TP spans hosts
    with TP 1 × PP 4 as the fix."""
    rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", "--nodes", "4", "--link", "10gbe",
               "--tensor-parallel-size", "4", "--max-model-len", "8192", "--vllm-version", "0.32.0"])
    out = capsys.readouterr().out
    assert rc == 0 and "rig: 4 hosts × 1 card, 10 GbE (TCP) — the link's share of a decode step:" in out
    assert "tp_spans_hosts" in out and "--tensor-parallel-size 1 --pipeline-parallel-size 4" in out
    rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", "--nodes", "4", "--link", "10gbe",
               "--pipeline-parallel-size", "4", "--max-model-len", "8192", "--vllm-version", "0.32.0", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["rig"]["tp_hosts"] == 1 and 0 < d["rig"]["link_share"] < 0.5
    assert "tp_spans_hosts" not in [f["problem"] for f in d["findings"]]


@pytest.mark.parametrize("args, says", [
    (["--nodes", "1,4", "--link", "eth"], "--link.*not in the link catalog.*ib-hdr200"),
    (["--nodes", "1,4"], "--nodes 1,4 needs --link NAME"),
    (["--link", "10gbe"], "--link belongs to the rig what-if: add --nodes"),
    (["--cards-per-node", "2"], "--cards-per-node belongs to the rig what-if"),
    (["--nodes", "2", "--link", "10gbe", "--count", "4"], "drop --count"),
    (["--nodes", "1,2", "--link", "10gbe", "--tensor-parallel-size", "2"], "drop --tensor-parallel-size.*one --nodes N"),
    (["--nodes", "2", "--link", "10gbe", "--gpu", "RTX 3090"], "give one --gpu NAME"),
    (["--nodes", "2", "--link", "10gbe", "--from-run", "1"], "give one of them"),
    (["--nodes", "4", "--link", "10gbe", "--tensor-parallel-size", "2"], "--nodes 4 × --cards-per-node 1 = 4 cards, "
     "but the layout uses 2"),
    # vLLM's multi-node data parallel: replicas within a host, a multiple of the hosts (app.hosts.plan.mp_plan)
    (["--nodes", "4", "--link", "10gbe", "--pipeline-parallel-size", "2", "--data-parallel-size", "2"],
     "--nodes 4: data_parallel_size 2 replicas cannot be spread evenly over 4 hosts"),
])
def test_rig_what_if_bad_combinations_name_the_option_and_fix(args, says, capsys):
    import contextlib
    with pytest.raises(SystemExit) if "eth" in args else contextlib.nullcontext():
        rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", *args])
        assert rc == 2
    import re
    assert re.search(says, capsys.readouterr().err)
