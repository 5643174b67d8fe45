from app.paths import data_dir, settings_path
from app.server.interpreter import resolve_python
from app.settings import Settings, load_settings, save_settings


def test_home_override(dyno_home):
    assert data_dir() == dyno_home and settings_path().parent == dyno_home


def test_round_trip_and_broken_file(dyno_home):
    s = Settings(vllm_python="/opt/vllm/bin/python", gpu_sample_hz=2)
    save_settings(s)
    assert load_settings() == s
    assert resolve_python() == "/opt/vllm/bin/python"
    settings_path().write_text("gpu_sample_hz: [oops\n")
    bad = load_settings()
    assert bad.load_error and "settings.yaml" in bad.load_error and bad.gpu_sample_hz == 4.0
    settings_path().write_text("gpu_sample_hz: -1\n")
    assert "gpu_sample_hz" in load_settings().load_error


def test_python_resolution_order(monkeypatch, dyno_home):
    monkeypatch.setenv("VLLM_DYNO_VLLM_PYTHON", "/env/python")
    assert resolve_python("/explicit/python") == "/explicit/python"
    assert resolve_python() == "/env/python"
    monkeypatch.delenv("VLLM_DYNO_VLLM_PYTHON")
    assert resolve_python().endswith(".venv-vllm/bin/python")
