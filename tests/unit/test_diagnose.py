"""Log diagnosis beyond the launch cases (tests/cases/launch/): wrappers, ANSI, silence, version errors, CLI."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.planner.diagnose import diagnose, diagnose_text
from tests.conftest import CASES

WRAPPED = """\
(EngineCore_DP0 pid=51) INFO 01-01 10:00:00 [core.py:90] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.95}
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:700] Traceback (most recent call last):
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
(APIServer pid=50) ERROR 01-01 10:00:10 [api_server.py:10] RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_wrapper_points_at_the_root_cause_above():
    d = diagnose(WRAPPED.splitlines())
    assert d.problem == "cuda_oom"
    assert d.fix == {"gpu_memory_utilization": 0.9}  # the utilization in force (non-default args) − 0.05
    assert "torch.OutOfMemoryError" in d.evidence[0] and "initialization failed" in d.evidence[-1]


def test_wrapper_alone_is_named_as_such():
    d = diagnose(["RuntimeError: Engine core initialization failed. See root cause above."])
    assert d.problem == "engine_init_failed" and d.fix == {}
    d = diagnose(["vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."])
    assert d.problem == "engine_dead"


def test_engine_dead_after_ready_finds_runtime_root_cause():
    lines = ["INFO Application startup complete.",
             "ERROR RuntimeError: Unsupported CPU attention configuration: head_dim=16 is not supported",
             "ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace above"]
    d = diagnose(lines)
    assert d.problem == "attention_unsupported"


def test_ansi_colours_and_commas():
    line = ("\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m ERROR ValueError: To serve at least one request with the "
            "models's max seq len (131,072), (16.00 GiB KV cache is needed, which is larger than the available KV "
            "cache memory (2.50 GiB). Based on the available memory, the estimated maximum model length is 20,480. Try")
    d = diagnose([line])
    assert d.problem == "context_exceeds_kv_cache" and d.fix == {"max_model_len": 20480}
    assert "\x1b" not in d.evidence[0]


def test_nccl_silence_threshold():
    log = (CASES / "launch" / "nccl-p2p-hang.yaml").read_text()
    import yaml

    lines = yaml.safe_load(log)["log"].splitlines()
    assert diagnose(lines, silent_for_s=120) is None
    assert diagnose(lines, silent_for_s=None) is None
    assert diagnose(lines, silent_for_s=300).problem == "nccl_hang"
    # something printed after NCCL: not a hang at NCCL
    assert diagnose(lines + ["INFO Loading weights took 3.2 seconds"], silent_for_s=900) is None


def test_version_errors():
    d = diagnose(["vllm serve: error: unrecognized arguments: --swap-space 4"])
    assert d.problem == "option_not_accepted" and d.fix == {"swap_space": None}
    d = diagnose(["ValueError: Unknown quantization method: gguf. Must be one of ['awq', 'fp8']."])
    assert d.problem == "quantization_unknown" and d.fix == {"quantization": None}
    assert diagnose(["OSError: [Errno 98] Address already in use"]).problem == "port_in_use"
    assert diagnose(["INFO all good"]) is None


def test_supervisor_shape():
    d = diagnose_text(WRAPPED)
    s = d.summary()
    assert s.startswith("Diagnosis: cuda_oom") and "--gpu-memory-utilization 0.9" in s and "\n" not in s


def test_cli_diagnose_every_case(tmp_path, capsys):
    import yaml

    for path in sorted((CASES / "launch").glob("*.yaml")):
        c = yaml.safe_load(path.read_text())
        log = tmp_path / f"{c['id']}.log"
        log.write_text(c["log"])
        argv = ["diagnose", str(log), "--json"]
        if c.get("silent_for_s"):
            argv += ["--silent-for", str(c["silent_for_s"])]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["problem"] == c["expect"]["diagnosis"]["problem"]
        assert out["fix"] == c["expect"]["diagnosis"].get("fix", out["fix"])


def test_cli_diagnose_missing_file(capsys):
    with pytest.raises(SystemExit) as ei:  # argparse's error (app.cli.common.input_file): exit 2
        main(["diagnose", "/nonexistent/vllm.log"])
    assert ei.value.code == 2
    assert "argument logfile: /nonexistent/vllm.log: no such file" in capsys.readouterr().err
