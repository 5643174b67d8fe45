"""Issue 15 item 13: hostile profile and settings files.

Each test is the attack: a profile file with 50,000 levels of nesting, a 5,000-digit
integer, duplicate keys, a "billion laughs" settings.yaml (359 bytes that expand to 10⁹
values), a deeply nested settings.yaml. The outcome asserted: the bad file is refused
with its name, the key and the reason, the other profiles still load, every command
still runs (exit 0 where it would have; 2 naming the file where the bad profile itself
was asked for), the window opens, and no traceback anywhere. The loader's limits are
app.fileio.YamlLimits; benchmarks/yaml_limits.py measures the worst inputs.
"""
from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from app.fileio import DEFAULT_YAML_LIMITS, YamlError, load_yaml, read_yaml
from app.profiles import ProfileLibrary
from app.profiles.io import ProfileError, parse_profile
from app.settings import load_settings_report

ROOT = Path(__file__).resolve().parents[2]

GOOD = "schema_version: 1\nname: good rig\nengine: sim\nserver:\n  model: Llama-3-8B\n  max-num-seqs: 8\n"


def billion_laughs(levels: int = 9) -> str:
    """The classic: 9 lists of 9 aliases of the one before, 10⁹ strings when expanded."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghij"
    for prev, cur in zip(names[:levels - 1], names[1:levels]):
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


#: profile attacks: (file text, the key the refusal names, a word of the reason)
PROFILE_ATTACKS = {
    "deep-flow": ("name: deep\nserver: {model: m}\nnotes: " + "[" * 50_000 + "]" * 50_000 + "\n",
                  "notes", "nested deeper than 64"),
    "deep-block": ("name: deepb\nserver: {model: m}\nramp:\n"
                   + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(200)), "ramp", "nested deeper than 64"),
    "huge-int": ("name: bigint\nserver:\n  model: m\n  max-num-seqs: " + "9" * 5_000 + "\n",
                 "server.max-num-seqs", "an integer of 5,000 characters"),
    "dup-top": ("name: first\nserver: {model: m}\nname: second\n", "name", "duplicate key 'name'"),
    "dup-nested": ("name: dupn\nserver:\n  model: m\n  max-num-seqs: 8\n  max-num-seqs: 64\n",
                   "server.max-num-seqs", "duplicate key 'max-num-seqs'"),
    "dup-env": ("name: dupe\nserver: {model: m}\nenv: {VLLM_X: '1', VLLM_X: '2'}\n", "env.VLLM_X", "duplicate key"),
    "laughs": ("name: lol\nserver: {model: m}\nnotes: x\n" + billion_laughs(), "a", "anchors (&name)"),
    "bad-date": ("name: d\nserver: {model: m}\nnotes: 2001-13-01\n", "notes", "not a valid timestamp"),
}


@pytest.mark.parametrize("attack", list(PROFILE_ATTACKS))
def test_hostile_profile_is_skipped_with_name_key_and_reason_and_the_rest_load(attack, dyno_home):
    text, key, why = PROFILE_ATTACKS[attack]
    lib = ProfileLibrary()
    (lib.directory / "good.yaml").write_text(GOOD)
    bad = lib.directory / f"{attack}.yaml"
    bad.write_text(text)
    res = lib.scan()
    assert "good rig" in res.names() and "CPU tiny model" in res.names()  # user and built-in still load
    assert [Path(e.file).name for e in res.errors] == [bad.name]
    e = res.errors[0]
    assert e.key.startswith(key) and why in e.reason, str(e)
    assert "line " in e.reason
    assert str(e).startswith(f"{bad}: {key}")


def test_duplicate_keys_name_both_lines():
    with pytest.raises(ProfileError) as ei:
        parse_profile("name: a\nserver:\n  model: m\n  model: n\n", "t.yaml")
    assert ei.value.key == "server.model"
    assert "duplicate key 'model' (first at line 3)" in ei.value.reason and "(line 4)" in ei.value.reason
    # a merge key's values may be overridden (YAML's rule), which is not a duplicate
    assert load_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\n") == {"base": {"x": 1, "y": 2},
                                                                       "d": {"x": 3, "y": 2}}


def cli_main(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


#: settings attacks: (file text, what the warning names besides the file)
SETTINGS_ATTACKS = {
    "laughs": (billion_laughs(), "billion laughs"),
    "deep": ("safety: " + "[" * 50_000 + "]" * 50_000 + "\n", "safety"),
    "deep-map": ("pricing:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(100)), "pricing"),
    "huge-int": ("gpu_sample_hz: " + "1" * 5_000 + "\n", "gpu_sample_hz"),
    "dup": ("gpu_sample_hz: 4\nmetrics_scrape_hz: 2\ngpu_sample_hz: 40\n", "duplicate key 'gpu_sample_hz'"),
    "cycle": ("safety: &s {enabled: true, again: *s}\n", "safety.again"),
    "tag": ("vllm_python: !!python/object/apply:os.system [echo]\n", "YAML tag not allowed"),
}


def test_billion_laughs_settings_is_refused_before_it_expands(dyno_home):
    """359 bytes; before the limits, loading it took 38 s and 5.5 GB (the expansion ran in
    repr() of the bad value). Now the loader refuses it after 20,000 values (YamlLimits.max_nodes)."""
    text = billion_laughs()
    assert len(text) < 400
    (dyno_home / "settings.yaml").write_text(text)
    tracemalloc.start()
    try:
        rep = load_settings_report()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert rep.settings.gpu_sample_hz == 4.0  # the defaults
    assert str(dyno_home / "settings.yaml") in rep.settings.load_error
    assert f"{DEFAULT_YAML_LIMITS.max_nodes:,} values once its aliases are expanded" in rep.settings.load_error


@pytest.mark.parametrize("attack", list(SETTINGS_ATTACKS))
def test_hostile_settings_give_defaults_and_a_warning_naming_file_and_key(attack, dyno_home):
    text, named = SETTINGS_ATTACKS[attack]
    (dyno_home / "settings.yaml").write_text(text)
    rep = load_settings_report()
    assert rep.settings.safety.enabled and rep.settings.gpu_sample_hz == 4.0
    assert rep.notes and str(dyno_home / "settings.yaml") in rep.notes[0] and named in rep.notes[0], rep.notes


def test_every_yaml_read_goes_through_the_one_loader():
    """No module of the app parses YAML another way (yaml.safe_load, yaml.load,
    yaml.full_load, a CLoader): app.fileio.load_yaml is the one loader."""
    bad = []
    for p in sorted((ROOT / "app").rglob("*.py")) + sorted((ROOT / "widgets").rglob("*.py")):
        if p == ROOT / "app" / "fileio.py":
            continue
        text = p.read_text(encoding="utf-8")
        for needle in ("yaml.safe_load", "yaml.load(", "yaml.full_load", "yaml.unsafe_load", "CLoader",
                       "CSafeLoader", "yaml.load_all", "yaml.safe_load_all", "yaml.compose"):
            if needle in text:
                bad.append(f"{p.relative_to(ROOT)}: {needle}")
    assert bad == []


def test_loader_limits_each_kind():
    lim = DEFAULT_YAML_LIMITS
    cases = {
        # the top-level mapping is the first level
        "x: " + "[" * lim.max_depth + "]" * lim.max_depth: "nested deeper than",
        "x: " + "[" * (lim.max_depth - 1) + "]" * (lim.max_depth - 1): None,  # exactly at the limit: fine
        "x: " + "1" * (lim.max_int_chars + 1): "an integer of",
        "x: " + "1" * lim.max_int_chars: None,
        "a: &a [1]\n" + "".join(f"b{i}: *a\n" for i in range(lim.max_aliases + 1)): "more than 100 YAML aliases",
        "a: &a [1]\n" + "".join(f"b{i}: *a\n" for i in range(lim.max_aliases)): None,
        "a: &a {b: *a}\n": "refers to a collection that contains it",
        "a: !!binary zz\n": "Incorrect padding",
        "a: !!bool maybe\n": "not a valid bool",
        "a: \x00\n": "a character YAML does not allow",
        "a: [1, 2\n": "broken YAML",
        "a: 1\n---\nb: 2\n": "broken YAML",
        "? [a]\n: 1\n": "unhashable",
        "x: " + "y" * (lim.max_bytes + 1): "larger than 1.0 MiB",
    }
    for text, why in cases.items():
        if why is None:
            load_yaml(text)
            continue
        with pytest.raises(YamlError, match=why.replace("(", r"\(").replace(")", r"\)")):
            load_yaml(text)


def test_big_file_refused_unread(tmp_path):
    p = tmp_path / "big.yaml"
    with p.open("w") as f:
        f.write("x: ")
        f.truncate(64 * 2**20)  # sparse: 64 MiB that need not be read to be refused
    with pytest.raises(YamlError, match="64.0 MiB is larger than 1.0 MiB"):
        read_yaml(p)
