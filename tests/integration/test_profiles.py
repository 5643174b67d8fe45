"""The process-starting half of tests/unit/test_profiles.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import signal
import time
from app.profiles import parse_profile, read_profile
from app.profiles.io import write_profile
from tests.unit.test_profiles import GOOD, lib, saver_script  # noqa: F401  (lib: a fixture)


def test_kill_while_saving_leaves_old_profile_intact(tmp_path, lib):
    target = lib.directory / "my-rig.yaml"
    write_profile(target, parse_profile(GOOD))
    old = target.read_bytes()
    proc = saver_script(tmp_path, target, "hang-before-replace")
    try:
        assert proc.stdout.readline().strip() == "temp written"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert target.read_bytes() == old
    leftovers = [p for p in lib.directory.iterdir() if p.name.endswith(".tmp")]
    assert leftovers, "the killed save left its temporary file (ignored by the loader)"
    res = lib.scan()
    assert not res.errors and res.get("my rig").profile.notes == "fast"


def test_kill_at_random_moments_while_saving_never_breaks_the_profile(tmp_path, lib):
    import random

    target = lib.directory / "my-rig.yaml"
    write_profile(target, parse_profile(GOOD))
    rng = random.Random(1)
    for _ in range(4):
        proc = saver_script(tmp_path, target, "loop")
        try:
            assert proc.stdout.readline().strip() == "saving"
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        p = read_profile(target)  # always a whole profile: the old or a new one
        assert p.name == "my rig" and p.server["max-num-seqs"] == 32
