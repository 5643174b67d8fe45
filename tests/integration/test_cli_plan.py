"""The process-starting half of tests/unit/test_cli_plan.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import json
from app.cli import main


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
