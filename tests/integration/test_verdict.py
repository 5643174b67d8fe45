"""The process-starting half of tests/unit/test_verdict.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
from app.config import ServerConfig
from app.loadgen.spec import SLO, RampSpec


def test_every_ramp_gets_a_verdict_stored_with_the_run(tmp_path, dyno_home, capsys):
    """A fixed ramp on a simulated rig (its cards report power): the verdict's users is the
    last level that met the SLO, J/token and $ come from the measured power and Settings,
    and the sentence is stored with the run and printed by `runs show`."""
    from app.cli import main
    from app.run.controller import LaunchTarget, RecordSpec, RunController
    from app.settings import Settings, save_settings
    from app.store import RunStore

    save_settings(Settings(pricing={"gpu_hour": 0.4, "kwh": 0.3}))
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", tensor_parallel_size=2,
                       max_num_seqs=16, max_model_len=4096)
    rig = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "2", "--sim-time-scale", "10", "--sim-seed", "1"]
    with RunStore(dyno_home / "runs.sqlite") as store:
        ctl = RunController(store=store)
        try:
            assert ctl.launch(LaunchTarget("sim", cfg, sim_args=rig)) == []
            assert ctl.wait_ready(60), ctl.failure_text
            spec = RampSpec(url=ctl.url, model="q7", levels=[1, 2, 4, 8, 16, 32], step_seconds=40,
                            warmup_seconds=5, prompt_tokens=512, output_tokens=64, slo=SLO(ttft_p99=0.5))
            out = ctl.ramp(spec, record=RecordSpec(name="verdict"), timeout=300)
        finally:
            ctl.stop()
            ctl.close()
        v = out.verdict
        met = [s.level for s in out.steps if s.slo_met]
        assert out.status == "slo_broken" and v is not None and v.users == max(met)
        assert v.rig == "2× RTX 4090 (sim)" and v.model == "Qwen/Qwen2.5-7B-Instruct"
        assert v.j_per_token and v.j_per_token > 0 and v.cost_per_mtok and v.cost_per_mtok > 0
        assert v.flags["tensor_parallel_size"] == 2 and v.flags["max_num_seqs"] == 16
        assert v.limited_by in ("ttft", "max_num_seqs", "kv_cache") and v.next_try
        run = store.get_run(out.run_id)
        assert run["summary"]["verdict"]["sentence"] == v.sentence
        assert run["summary"]["results"]["verdict"] == v.sentence and run["summary"]["results"]["users_at_slo"] == v.users
        assert run["summary"]["users_at_slo"]["users"] == v.users
    assert main(["runs", "show", str(out.run_id)]) == 0
    assert v.sentence in capsys.readouterr().out
