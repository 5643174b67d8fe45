"""The process-starting half of tests/unit/test_cli_args.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
from tests.unit.test_cli_args import cli_main


def test_a_startup_timeout_is_a_failed_run_exit_1(dyno_home):
    """Before: a startup timeout exited 0. The sim needs a few seconds to be ready, the
    timeout is 0.05 s."""
    r = cli_main("serve", "--engine", "sim", "--model", "Llama-3-8B", "--sim-gpu", "RTX 4090",
             "--startup-timeout", "0.05")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "startup timeout" in r.stdout and "Traceback" not in r.stderr
    r = cli_main("run", "Sim demo: 8x RTX 4090 Llama-3-70B AWQ", "--startup-timeout", "0.05", "--levels", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "launch_failed" in r.stdout and "startup timeout" in r.stdout and "Traceback" not in r.stderr
