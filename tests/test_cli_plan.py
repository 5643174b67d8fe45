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


def test_mixed_cards_json(capsys):
    rc = main(["plan", "--model", "Qwen3-30B-A3B", "--gpu", "RTX 5070 Ti", "--gpu", "RTX 5090",
               "--pipeline-parallel-size", "2", "--max-model-len", "32768", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert [r["gpu"] for r in d["ranks"]] == ["RTX 5070 Ti", "RTX 5090"]
    assert d["kv_bytes_per_token"] == 98304 and rc in (0, 1)


def test_error_verdict_exit_code(capsys):
    rc = main(["plan", "--model", "Llama-2-13B", "--gpu", "RTX 3090", "--count", "3", "--tensor-parallel-size", "3"])
    out = capsys.readouterr().out
    assert rc == 1 and "tp_not_divisor_of_heads" in out and "--tensor-parallel-size 2" in out


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
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()[1:-1]}
    assert set(rows) == set(load_catalog())
    assert "Quadro RTX 8000" in rows and " 7.5 " in rows["Quadro RTX 8000"] and "NVIDIA L40S" in rows["L40S"]
    assert "NAME:GIB:CC" in out.splitlines()[-1]


def test_plan_parser_takes_every_vllm_option():
    """config → argv → `plan`'s parser → config: equal for every declared option."""
    from app.cli import build_parser
    from app.config import ServerConfig
    from app.cli.common import config_from_args
    from tests.test_config import ALL_OPTIONS

    cfg = ServerConfig(model="Llama-3-70B", **ALL_OPTIONS)
    ns = build_parser().parse_args(["plan", "--model", cfg.model, *cfg.option_argv(), "--gpu", "RTX 5090"])
    assert config_from_args(ns) == cfg


def test_plan_rejects_bad_option_values_naming_the_field():
    with pytest.raises(SystemExit, match="gpu_memory_utilization"):
        main(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", "--gpu-memory-utilization", "1.5"])
