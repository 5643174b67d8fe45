"""The thermal safety stop reads the live telemetry bank (real SeriesBank, samples as
the GPU sampler delivers them)."""
from __future__ import annotations

from app.run.safety import apply_safety, thermal_stop_reason
from app.telemetry.series import Sample, SeriesBank


def test_thermal_stop_within_margin_only():
    bank = SeriesBank()
    bank([Sample(1.0, "gpu0", "temp_gpu_c", 80.0), Sample(1.0, "gpu0", "temp_slowdown_c", 90.0),
          Sample(1.0, "gpu1", "temp_gpu_c", float("nan")), Sample(1.0, "gpu1", "temp_slowdown_c", 90.0)])
    assert thermal_stop_reason(bank, 3.0) is None
    bank([Sample(2.0, "gpu0", "temp_gpu_c", 87.0)])
    reason = thermal_stop_reason(bank, 3.0)
    assert reason == "safety stop: GPU 0 reached 87 °C, within 3 °C of its slowdown temperature 90 °C"
    assert thermal_stop_reason(SeriesBank(), 3.0) is None


def test_apply_safety_sets_the_failure_rate_limit():
    from app.loadgen.spec import RampSpec
    from app.settings import SafetyLimits

    spec = RampSpec(url="http://127.0.0.1:1", levels=[1], max_failure_rate=0.5)
    assert apply_safety(spec, None) is spec
    assert apply_safety(spec, SafetyLimits(max_failure_rate=0.1)).max_failure_rate == 0.1
    assert apply_safety(spec, SafetyLimits(enabled=False)).max_failure_rate == 1.0


def test_one_failure_rate_default_and_the_settings_unless_opted_out(dyno_home):
    """The ramp spec's default failure-rate limit is the Settings' (one value); a caller
    that gives no limits gets the user's Settings as they are on disk now, its own limits
    are kept, and only NO_SAFETY runs without any."""
    from app.loadgen.spec import RampSpec
    from app.run.safety import NO_SAFETY, resolve_safety
    from app.settings import DEFAULT_MAX_FAILURE_RATE, SafetyLimits, Settings, save_settings

    assert RampSpec(levels=[1]).max_failure_rate == SafetyLimits().max_failure_rate == DEFAULT_MAX_FAILURE_RATE == 0.2
    assert resolve_safety(None) == SafetyLimits()
    save_settings(Settings(safety=SafetyLimits(thermal_margin_c=7.0, max_failure_rate=0.05)))
    assert resolve_safety(None) == SafetyLimits(thermal_margin_c=7.0, max_failure_rate=0.05)
    own = SafetyLimits(max_failure_rate=0.4)
    assert resolve_safety(own) is own and resolve_safety(NO_SAFETY) is None
    import pytest

    with pytest.raises(TypeError, match="NO_SAFETY"):
        resolve_safety(0.5)


def test_the_controller_stops_a_ramp_on_the_thermal_limit_for_every_front_end(tmp_path):
    """The thermal stop is the run controller's: a card within the margin of its slowdown
    temperature stops a ramp started headless (no Qt anywhere) with no limits given — the
    user's Settings apply — and the run records why; NO_SAFETY, given explicitly, runs
    without the stop."""
    import threading

    from app.config import ServerConfig
    from app.loadgen.spec import RampSpec
    from app.run.controller import LaunchTarget, RecordSpec, RunController, RunListener
    from app.run.safety import NO_SAFETY
    from app.settings import SafetyLimits
    from app.store import RunStore
    from tests.loadgen_server import Script, ScriptedServer

    stops: list[str] = []
    started = threading.Event()

    class L(RunListener):
        def on_level_start(self, ev):
            started.set()

        def on_safety_stop(self, reason):
            stops.append(reason)

    with RunStore(tmp_path / "runs.sqlite") as store, ScriptedServer(Script(ttft=0.01, itl=0.005)) as srv:
        ctl = RunController(store=store, listener=L())
        ctl.launch(LaunchTarget("attach", ServerConfig(model="m"), attach_url=srv.url, telemetry=False))
        spec = RampSpec(url=srv.url, levels=[1, 2], step_seconds=30, prompt_tokens=8, output_tokens=8)
        ctl.start_ramp(spec, record=RecordSpec(name="hot"))  # no limits given: Settings' (margin 3 °C)
        assert ctl.ramp_spec.max_failure_rate == SafetyLimits().max_failure_rate
        assert started.wait(30)
        ctl.bank([Sample(ctl.clock.now(), "gpu0", "temp_gpu_c", 88.0),
                  Sample(ctl.clock.now(), "gpu0", "temp_slowdown_c", 90.0)])
        out = ctl.wait_ramp(30)
        assert out is not None and out.status == "safety", out
        assert stops and "GPU 0 reached 88 °C" in out.stop_reason
        run = store.get_run(out.run_id)
        assert run["status"] == "safety" and run["summary"]["stop_reason"] == out.stop_reason
        # opted out: the card stays hot and the ramp runs to its end
        started.clear()
        short = spec.model_copy(update={"levels": [1], "step_seconds": 1.0, "max_failure_rate": 0.9})
        ctl.start_ramp(short, record=RecordSpec(name="hot, no safety"), safety=NO_SAFETY)
        assert ctl.ramp_spec.max_failure_rate == 0.9  # the spec's own limit
        out = ctl.wait_ramp(30)
        ctl.close()
        assert out is not None and out.status == "done", out


def test_ramp_takes_settings_failure_rate_unless_given_its_own():
    """``ramp`` without --max-failure-rate: the spec's default, the Settings' (0.2; the
    controller then applies the user's Settings); --max-failure-rate: this ramp's."""
    from app.cli import build_parser
    from app.cli.ramp import spec_from_args
    from app.settings import SafetyLimits

    p = build_parser()
    assert spec_from_args(p.parse_args(["ramp", "--levels", "1"])).max_failure_rate == \
        SafetyLimits().max_failure_rate
    assert spec_from_args(p.parse_args(["ramp", "--levels", "1", "--max-failure-rate", "0.35"])).max_failure_rate \
        == 0.35
