"""Issue 15, item 4, tried as an attack: a profile's ``server: {host: 0.0.0.0}`` must not
bind every interface silently. Beyond loopback needs ``--expose`` (CLI) or the window's
confirmation; without it the launch is refused with the reason; with it the server really
listens there, the real addresses are printed with a warning when no API key is set, and
vLLM Dyno still reaches the server through loopback. An invalid host is a clear error."""
from __future__ import annotations

import pytest

from app.cli import main
from app.config import ServerConfig, exposure_lines, exposure_problem, is_loopback_host
from app.profiles import parse_profile
from app.profiles.io import ProfileError
from app.run.controller import LaunchTarget, RunController
from app.run.profile_run import ProfileRun
from app.server.launch import LaunchError
from app.store import RunStore

RIG = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1", "--sim-time-scale", "20", "--sim-seed", "1"]


def _profile(host: str) -> str:
    return ("schema_version: 1\nname: exposed\nengine: sim\nsim: {gpu: RTX 4090, count: 1, time_scale: 20, seed: 1}\n"
            f"server: {{model: Qwen/Qwen2.5-7B-Instruct, served-model-name: q7, max-num-seqs: 8, "
            f"max-model-len: 2048, host: '{host}'}}\n"
            "ramp: {levels: [1], step_seconds: 3, prompt_tokens: 32, output_tokens: 8}\n")


def _listening(port: int) -> set[str]:
    """Local addresses with a TCP socket in LISTEN on ``port`` (from /proc/net/tcp{,6})."""
    out = set()
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            addr, p = f[1].split(":")
            if int(p, 16) == port and f[3] == "0A":
                out.add("0.0.0.0" if set(addr) == {"0"} and width == 8 else ("::" if set(addr) == {"0"} else addr))
    return out


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.10"])
def test_hosts_beyond_loopback_need_a_confirmation(host):
    assert not is_loopback_host(host)
    why = exposure_problem(host)
    assert why and host in why and "--expose" in why


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_none(host):
    assert exposure_problem(host) is None and exposure_lines(host, 8000, {}) == []


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_profile_with_an_every_interface_host_is_refused_by_run_without_expose(host, tmp_path, capsys):
    f = tmp_path / "exposed.yaml"
    f.write_text(_profile(host))
    assert main(["run", str(f)]) == 2
    err = capsys.readouterr().err
    assert host in err and "--expose" in err and "Traceback" not in err


def test_serve_with_an_every_interface_host_is_refused_without_expose(capsys):
    assert main(["serve", "--engine", "sim", "--model", "m", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "--expose" in err and "Traceback" not in err


def test_the_library_refuses_too_without_the_users_word(tmp_path):
    """Not only the front-ends: the run controller and a headless ProfileRun refuse."""
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", host="0.0.0.0")
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store)
        with pytest.raises(LaunchError, match="0.0.0.0.*--expose"):
            ctl.launch(LaunchTarget("sim", cfg, sim_args=RIG, telemetry=False), check_leftovers=False)
        assert ctl.supervisor is None and ctl.close() == []
        res = ProfileRun(parse_profile(_profile("0.0.0.0")), store=store, telemetry=False, use_planner=False).run()
        assert res.status == "launch_failed" and "--expose" in res.reason


@pytest.mark.parametrize("argv", [["--host", "999.1.1.1"], ["--host", "1.2.3"], ["--host", "a b"],
                                  ["--host", "::g"], ["--host", ""], ["--host=-bad-.x"]])
def test_an_invalid_host_is_a_clear_error(argv, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--engine", "sim", "--model", "m", *argv])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "host" in err and "Traceback" not in err


def test_a_profile_with_an_invalid_host_is_refused():
    with pytest.raises(ProfileError, match="999.1.1.1"):
        parse_profile(_profile("999.1.1.1"))


def test_with_expose_the_server_binds_every_interface_and_the_missing_key_is_warned(tmp_path, monkeypatch,
                                                                                      capsys):
    """`vllm-dyno run PROFILE --expose` with host 0.0.0.0: the sim server listens on
    0.0.0.0 (read from /proc/net/tcp while it is up), the real addresses and the missing
    API key warning are printed, and the URL used to reach it stays on loopback."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    f = tmp_path / "exposed.yaml"
    f.write_text(_profile("0.0.0.0"))
    seen: dict = {}
    import app.run.profile_run as pr

    real = pr.ProfileRun._set_phase

    def spy(self, phase, message=""):
        if phase == pr.Phase.READY:
            sup = self.supervisor
            seen["port"], seen["url"] = sup.config.port, self.controller.url
            seen["listening"] = _listening(sup.config.port)
        return real(self, phase, message)

    monkeypatch.setattr(pr.ProfileRun, "_set_phase", spy)
    rc = main(["run", str(f), "--expose", "--startup-timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "0.0.0.0" in seen["listening"], seen
    assert seen["url"].startswith("http://127.0.0.1:")
    assert f"listening on all interfaces (0.0.0.0:{seen['port']})" in out
    assert "warning: no API key is set (VLLM_API_KEY)" in out


def test_with_a_key_set_no_warning_is_printed():
    lines = exposure_lines("0.0.0.0", 8000, {"VLLM_API_KEY": "k"})
    assert lines and lines[0].startswith("listening on all interfaces") and not any("warning" in x for x in lines)


def test_the_window_asks_before_launching_beyond_loopback(qtbot, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from widgets.main_window import MainWindow
    from app.run.controller import LaunchTarget

    w = MainWindow()
    qtbot.addWidget(w)
    asked: list[str] = []

    def answer(result):
        def q(parent, title, text, *a, **k):
            asked.append(text)
            return result
        return q

    req = LaunchTarget(engine="sim", config=ServerConfig(model="m", host="0.0.0.0"))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(answer(QMessageBox.No)))
    assert w.confirm_exposure(req) is None
    assert "0.0.0.0" in asked[-1] and "no API key" in asked[-1]
    monkeypatch.setattr(QMessageBox, "question", staticmethod(answer(QMessageBox.Yes)))
    ok = w.confirm_exposure(req)
    assert ok is not None and ok.expose and ok.config.host == "0.0.0.0"
    n = len(asked)
    local = LaunchTarget(engine="sim", config=ServerConfig(model="m"))
    assert w.confirm_exposure(local) is local and len(asked) == n  # loopback: no question
    w.close()


def test_the_ipv6_wildcard_with_expose_launches_and_a_bad_host_is_a_launch_error():
    """`host: "::"` with the user's word: the port is chosen on an IPv6 socket (the sim
    listens on every IPv6 interface), reached through loopback; a host that resolves to
    nothing is a LaunchError naming it, never a socket traceback."""
    from app.server.launch import check_port, free_port

    ctl = RunController()
    try:
        ctl.launch(LaunchTarget("sim", ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", host="::"), sim_args=RIG,
                                telemetry=False, expose=True))
        assert ctl.wait_ready(60), ctl.failure_text
        assert ctl.url.startswith("http://[::1]:"), ctl.url  # reached on loopback
    finally:
        assert ctl.close() == []
    assert free_port("::") > 0
    with pytest.raises(LaunchError, match="no-such-host.invalid"):
        check_port("no-such-host.invalid", 8000)
