"""Profiles against the real CPU build of vLLM.

1. The ``--config`` YAML every built-in exports is accepted by vLLM's own argument
   parser — the parser ``python -m vllm.entrypoints.openai.api_server --config FILE``
   uses (``make_arg_parser`` + ``validate_parsed_serve_args``); for the CPU tiny model
   vLLM also builds its full engine configuration from it. Seconds, no launch.
2. ``vllm-dyno run "CPU tiny model"`` completes and records a run: the one vLLM launch
   of this file (short ramp).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from app.profiles import ProfileLibrary, to_vllm_config_yaml
from tests.conftest import ROOT



_ACCEPT = textwrap.dedent("""\
    import sys
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    full = sys.argv[1]
    for path in sys.argv[2:]:
        parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
        args = parser.parse_args(["--config", path])
        validate_parsed_serve_args(args)
        print("ACCEPTED", path, args.model, args.max_num_seqs, args.tensor_parallel_size, args.quantization,
              args.disable_custom_all_reduce, flush=True)
        if path == full:
            from vllm.engine.arg_utils import AsyncEngineArgs
            cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
            print("ENGINE-CONFIG", cfg.scheduler_config.max_num_seqs, cfg.model_config.served_model_name, flush=True)
""")


@pytest.mark.launches  # vLLM's own parser, no server, nothing timed (Makefile: `make test`)
def test_exported_config_yaml_is_accepted_by_vllm(vllm_python, tiny_model, tmp_path):
    lib = ProfileLibrary()
    files = {}
    for e in lib.scan().entries:
        f = tmp_path / f"{len(files)}.yaml"
        f.write_text(to_vllm_config_yaml(e.profile))
        files[e.name] = f
    script = tmp_path / "accept.py"
    script.write_text(_ACCEPT)
    full = files["CPU tiny model"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    r = subprocess.run([vllm_python, str(script), str(full), *map(str, files.values())], capture_output=True,
                       text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    accepted = [l for l in r.stdout.splitlines() if l.startswith("ACCEPTED")]
    assert len(accepted) == len(files)
    h100 = [l for l in accepted if str(files["8x H100 Llama-3-70B FP8"]) in l][0]
    assert " 256 8 " in h100  # max-num-seqs and tensor-parallel-size read from the file
    awq = [l for l in accepted if str(files["4x RTX 5090 Llama-3-70B AWQ"]) in l][0]
    assert awq.endswith("awq_marlin True")
    assert f"ACCEPTED {full} {tiny_model} 8 1 None" in r.stdout
    assert "ENGINE-CONFIG 8 tiny" in r.stdout


# not `launches`: the run's levels are fitted and the calibrated sim must land within 25 % of
# them — measured beside the multinode tier, c=4 read half of c=1 and the fit missed by 51 %
def test_vllm_dyno_run_cpu_tiny_builtin_records_a_run(vllm_python, tiny_model, dyno_home):
    from app.store import RunStore

    env = {**os.environ, "VLLM_DYNO_HOME": str(dyno_home), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "app.cli", "run", "CPU tiny model", "--python", vllm_python,
                        "--levels", "1,4", "--step-seconds", "4", "--startup-timeout", "500", "--save-results"],
                       capture_output=True, text=True, timeout=590, env=env, cwd=str(ROOT))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "[ready]" in out and "status: done" in out and "TTFT p99" in out
    with RunStore(dyno_home / "runs.sqlite") as store:
        runs = store.list_runs()
        assert len(runs) == 1
        run = store.get_run(runs[0]["id"])
        assert run["status"] == "done" and run["name"] == "CPU tiny model"
        lv = store.levels(run["id"])
        assert [d["level"] for d in lv] == [1.0, 4.0] and all(d["output_tps"] > 0 for d in lv)
        assert run["capacity"]["kv_cache_tokens"] == 1_048_576  # 1 GiB ÷ 1,024 B/token
        assert run["summary"]["hardware"]["gpu"] == "CPU"
        assert store.requests(run["id"]) and any("startup complete" in l for _, _, l in store.log_lines(run["id"]))
    saved = ProfileLibrary().entry("CPU tiny model")
    assert saved.source == "user" and saved.profile.results.levels[1].level == 4.0
    assert "survived" not in out  # the supervisor verified that the server's process group is gone

    # the recorded run calibrates the model for this host; the sim, stepping with the
    # fitted parameters through its own scheduler, reproduces the measured levels
    r = subprocess.run([sys.executable, "-m", "app.cli", "calibrate", str(run["id"])], capture_output=True,
                       text=True, timeout=120, env=env, cwd=str(ROOT))
    assert r.returncode == 0 and "saved to" in r.stdout, r.stdout + r.stderr
    print("\n" + r.stdout)
    from app.planner.calibrate import hardware_fingerprint, load_calibration
    from app.profiles.model import HardwareFingerprint
    from app.sim import model_adapter as ma
    from app.engine.offline import sim_level

    hw = HardwareFingerprint.model_validate(run["summary"]["hardware"])
    cfg = saved.profile.server_config()
    sp = ma.plan_rig(cfg, hw.planner_cards()[0], 1)
    params = load_calibration(hardware_fingerprint(sp.plan.cards))
    assert params is not None
    sm = ma.StepModel(sp, params=params)
    ramp = saved.profile.ramp
    for d in lv:
        got = sim_level(sp, sm, int(d["level"]), ramp.prompt_tokens, ramp.output_tokens, 20.0, 4.0)
        err = 100 * (got.throughput - d["output_tps"]) / d["output_tps"]
        print(f"sim, calibrated, c={d['level']:g}: {got.throughput:,.0f} tok/s vs measured {d['output_tps']:,.0f} "
              f"({err:+.1f} %)")
        assert abs(err) < 25.0
