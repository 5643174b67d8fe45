"""Issue 15: fuzzing the profile and settings readers with hypothesis — never a traceback.

Three kinds of input, each fed to every reader of a user's YAML (a profile file, a
``profiles import`` text, ``settings.yaml``):

- hostile fragments: brackets, braces, anchors, aliases, merge keys, tags, long digit
  runs, indentation, quotes and control characters strung together;
- well-formed YAML of random shape (nested mappings and lists of random scalars);
- a valid profile or settings mapping with one value, key or nesting level replaced.

The outcome asserted: a profile reader returns a Profile or raises ProfileError (naming
the label); the settings reader never raises and names the file in what it dropped; no
other exception, no RecursionError, no MemoryError. The examples are derandomized (the
same inputs on every run of ``make test``); HYPOTHESIS_PROFILE=explore runs 20× as many
fresh ones.
"""
from __future__ import annotations

import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.fileio import YamlError, load_yaml
from app.profiles.interop import import_text
from app.profiles.io import ProfileError, parse_profile
from app.settings import load_settings_report

EXPLORE = os.environ.get("HYPOTHESIS_PROFILE") == "explore"
FUZZ = settings(max_examples=4000 if EXPLORE else 200, deadline=None, derandomize=not EXPLORE,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

FRAGMENTS = ["[", "]", "{", "}", ",", ": ", ":", "- ", "? ", "&a ", "&b ", "*a", "*b", "<<: ", "!!python/object ",
             "!!int ", "!!float ", "!!bool ", "!!binary ", "!!timestamp ", "!!set ", "!!omap ", "!!str ", "! ",
             "9" * 50, "9" * 5000, "1:2:3", "0x", "0b", "0o", "-", ".inf", ".nan", "~", "null", "yes", "on",
             "2001-13-45", "2001-12-14t21:59:43.10-05:00", "'", '"', "\\", "#", "|", ">", "\n", "\n  ", "\n    ",
             "\t", "\x00", "\x85", "\ufeff", "---", "...", "%YAML 1.1", "%TAG", "name", "server", "model",
             "env", "ramp", "slo", "gpus", "engine", "schema_version", "max-num-seqs", "safety", "pricing",
             "gpu_sample_hz", "last_profile", "${HOME}", "${VLLM_API_KEY}", "x", "0", "1", "-1", "1e999"]

hostile = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(["vllm", "sim", "attach", "RTX 4090", "0,1", "auto"]))
keys = st.one_of(st.text(max_size=12), st.sampled_from(["name", "server", "model", "env", "ramp", "slo", "gpus",
                                                        "engine", "sim", "hardware", "results", "notes",
                                                        "schema_version", "max-num-seqs", "safety", "pricing",
                                                        "gpu_sample_hz", "metrics_scrape_hz", "last_profile",
                                                        "vllm_python", "enabled", "kwh", "gpu_hour"]),
                 st.integers(), st.booleans())
shapes = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=4)), max_leaves=25)

BASE_PROFILE = {"schema_version": 1, "name": "fuzz", "engine": "sim", "sim": {"gpu": "RTX 4090", "count": 8},
                "server": {"model": "Llama-3-8B", "max-num-seqs": 8, "tensor-parallel-size": 8},
                "env": {"VLLM_LOGGING_LEVEL": "INFO"}, "gpus": 8,
                "ramp": {"max_level": 8, "step_seconds": 5, "slo": {"ttft_p99": 2.0}}, "notes": "n"}
BASE_SETTINGS = {"schema_version": 1, "vllm_python": None, "gpu_sample_hz": 4.0, "metrics_scrape_hz": 2.0,
                 "safety": {"enabled": True, "thermal_margin_c": 3.0, "max_failure_rate": 0.2},
                 "pricing": {"gpu_hour": 1.5, "kwh": None, "currency": "$"}, "last_profile": "x"}


def _paths(d, prefix=()):
    yield prefix
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, prefix + (k,))


@st.composite
def mutated(draw, base: dict) -> str:
    """``base`` with one place (a value, or a key's name) replaced by a random shape, as YAML."""
    import copy

    d = copy.deepcopy(base)
    path = draw(st.sampled_from([p for p in _paths(base) if p]))
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    if draw(st.booleans()):
        parent[path[-1]] = draw(shapes)
    else:
        parent[draw(keys)] = parent.pop(path[-1])
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True)


profile_texts = st.one_of(hostile, shapes.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),
                          mutated(BASE_PROFILE), st.text(max_size=200))
settings_texts = st.one_of(hostile, shapes.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),
                           mutated(BASE_SETTINGS), st.text(max_size=200))


def test_base_documents_are_valid():
    """The mutations start from files that load: a failure below is the mutation's."""
    assert parse_profile(yaml.safe_dump(BASE_PROFILE), "base").name == "fuzz"


@FUZZ
@given(profile_texts)
def test_profile_yaml_never_tracebacks(text):
    try:
        parse_profile(text, "fuzz.yaml")
    except ProfileError as e:
        assert str(e).startswith("fuzz.yaml: ")


@FUZZ
@given(profile_texts)
def test_profile_import_never_tracebacks(text):
    """``vllm-dyno profiles import`` / the Profiles tab's Import: a profile, a vLLM --config
    YAML or a command line, whichever the text looks like."""
    try:
        import_text(text, None, "<import>")
    except ProfileError:
        pass


@FUZZ
@given(settings_texts)
def test_settings_yaml_never_tracebacks(text):
    # the test's own VLLM_DYNO_HOME (conftest) is function-scoped: one file, rewritten per example
    from app.paths import settings_path

    path = settings_path()
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    rep = load_settings_report(upgrade_file=False)
    assert rep.settings is not None
    for m in rep.messages:
        assert "settings.yaml" in m, m


@FUZZ
@given(st.one_of(hostile, st.text(max_size=300)))
def test_loader_raises_only_yaml_error(text):
    try:
        load_yaml(text)
    except YamlError as e:
        assert e.reason
