"""The process-starting half of tests/unit/test_hostile_files.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import pytest
from app.profiles import ProfileLibrary
from tests.unit.test_hostile_files import GOOD, PROFILE_ATTACKS, SETTINGS_ATTACKS, cli_main


def test_cli_with_hostile_profiles_lists_the_rest_and_refuses_the_bad_one(dyno_home):
    lib = ProfileLibrary()
    (lib.directory / "good.yaml").write_text(GOOD)
    for attack in ("deep-flow", "huge-int", "dup-top"):
        (lib.directory / f"{attack}.yaml").write_text(PROFILE_ATTACKS[attack][0])
    r = cli_main("profiles", "list")
    assert r.returncode == 0, r.stderr
    assert "good rig" in r.stdout and "Traceback" not in r.stderr + r.stdout
    for attack in ("deep-flow", "huge-int", "dup-top"):
        assert f"{attack}.yaml: " in r.stderr
    # asking for the bad profile itself: exit 2 naming the file, the key and the reason
    r = cli_main("run", "huge-int", "--levels", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "huge-int.yaml: server.max-num-seqs: an integer of 5,000 characters" in r.stderr
    r = cli_main("profiles", "show", "deep-flow")
    assert r.returncode == 2 and "deep-flow.yaml: notes" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("attack", ["laughs", "deep", "dup"])
def test_commands_run_with_a_hostile_settings_file(attack, dyno_home):
    (dyno_home / "settings.yaml").write_text(SETTINGS_ATTACKS[attack][0])
    r = cli_main("plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090", "--count", "1")
    assert r.returncode == 0, r.stderr
    assert "Plan: Llama-3-8B" in r.stdout
    assert "Traceback" not in r.stderr
    warning = [ln for ln in r.stderr.splitlines() if "settings.yaml" in ln]
    assert warning and SETTINGS_ATTACKS[attack][1] in warning[0], r.stderr
    r = cli_main("runs", "list")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
