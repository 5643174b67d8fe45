"""Packaging: version from package metadata, package data found through importlib.resources,
and — when `make package` has built dist/vllm-dyno — a smoke test of the frozen app.

The frozen smoke test is skipped (with a message) when no build exists; `make package-test`
runs it after `make package`.
"""
import os
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path

import pytest

from tests.conftest import ROOT

FROZEN = ROOT / "dist" / "vllm-dyno" / "vllm-dyno"


def test_version_from_metadata():
    v = metadata.version("vllm-dyno")
    r = subprocess.run([sys.executable, "-m", "app.cli", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == f"vllm-dyno {v}"


def test_package_data_through_importlib_resources():
    icons = resources.files("resources") / "icons"
    assert (icons / "vllm-dyno-256.png").is_file() and (icons / "vllm-dyno.svg").is_file()


def test_desktop_entry_and_metainfo_are_well_formed():
    import configparser
    import xml.etree.ElementTree as ET

    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(ROOT / "packaging/linux/io.github.vllm_dyno.VllmDyno.desktop")
    e = cp["Desktop Entry"]
    assert e["Exec"] == "vllm-dyno" and e["Icon"] == "vllm-dyno" and e["Type"] == "Application"
    root = ET.parse(ROOT / "packaging/linux/io.github.vllm_dyno.VllmDyno.metainfo.xml").getroot()
    assert root.find("id").text == "io.github.vllm_dyno.VllmDyno"
    assert root.find("launchable").text.endswith(".desktop")


def test_smoke_mode_from_source(tmp_path):
    """The smoke mode the frozen test relies on, run from the source tree (no build needed)."""
    shot = tmp_path / "smoke.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VLLM_DYNO_SMOKE=str(shot),
               VLLM_DYNO_HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-m", "app.cli"], capture_output=True, text=True, timeout=300, env=env,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "window shown" in r.stderr and "helper processes: app.loadgen.worker" in r.stderr, r.stderr
    assert shot.exists() and shot.stat().st_size > 10_000


def test_smoke_mode_rejects_a_bad_path(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VLLM_DYNO_SMOKE=str(tmp_path / "missing" / "x.png"),
               VLLM_DYNO_HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-m", "app.cli"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT)
    assert r.returncode == 1 and "does not exist" in r.stderr


@pytest.mark.skipif(not FROZEN.exists(), reason="no frozen build in dist/vllm-dyno: run `make package` first")
def test_frozen_app_version_and_smoke(tmp_path):
    r = subprocess.run([str(FROZEN), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("vllm-dyno ")
    shot = tmp_path / "smoke.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VLLM_DYNO_SMOKE=str(shot),
               VLLM_DYNO_HOME=str(tmp_path / "home"))
    # no Python on PATH: every helper process must be the frozen executable itself (`_helper`)
    nopy = tmp_path / "bin"
    nopy.mkdir()
    env["PATH"] = str(nopy)
    r = subprocess.run([str(FROZEN)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "helper processes: app.loadgen.worker, app.server.reaper, app.sim.server" in r.stderr, r.stderr
    assert shot.exists() and shot.stat().st_size > 10_000


@pytest.mark.skipif(not FROZEN.exists(), reason="no frozen build in dist/vllm-dyno: run `make package` first")
def test_frozen_build_contents():
    """xcb and offscreen platform plugins only, no Wayland/QML/WebEngine, no bundled NVML,
    and the package data at the places importlib.resources looks."""
    root = FROZEN.parent
    files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    platforms = sorted(f.rsplit("/", 1)[1] for f in files if "/plugins/platforms/" in f)
    assert platforms == ["libqoffscreen.so", "libqxcb.so"], platforms
    assert not [f for f in files if "libnvidia-ml" in f]
    assert not [f for f in files if any(k in f for k in ("wayland", "/qml/", "WebEngine", "libQt6Quick"))]
    internal = "_internal/"
    for want in ("profiles/sim-demo-8x-rtx-4090-llama-3-70b-awq.yaml", "app/planner/data/gpus.yaml",
                 "resources/style.qss", "resources/icons/vllm-dyno-256.png"):
        assert internal + want in files, want
