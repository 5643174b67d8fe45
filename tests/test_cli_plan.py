"""``vllm-dyno plan``: the seed scenario, mixed cards, JSON, bad input."""
from __future__ import annotations

import json

import pytest

from app.cli import main

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
    rc = main(["plan", "--model", "Llama-3-8B", "--gpu", "Voodoo 5:24", "--vllm-version", "0.32.0"])
    assert rc == 0 and "assumed figures" in capsys.readouterr().out


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
