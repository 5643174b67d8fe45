"""The library of published vLLM GPU runs (``benchmarks/data/realgpu``, issue 34 item 1):
every set loads, names cards and models the catalogs resolve, publishes only
``vllm bench serve --save-result`` keys, and cites none of the sources the project keeps
aside; the library's size targets; the loader's errors name the file and the field."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.planner.gpus import lookup_gpu
from app.planner.models import from_catalog
from app.planner.realruns import (
    BENCH_OPTIONS,
    RealRunError,
    forbidden_reason,
    is_known_measured_key,
    load_set,
    load_sets,
)

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "benchmarks" / "data" / "realgpu"

#: catalog cards a person buys for a desk or a home rig (GeForce)
CONSUMER = re.compile(r"^RTX [2-5]0[5-9]0")


@pytest.fixture(scope="module")
def sets():
    return load_sets(FOLDER)


def test_every_file_loads_and_ids_are_the_file_stems(sets):
    files = sorted(FOLDER.glob("*.yaml"))
    assert [s.id for s in sets] == [f.stem for f in files]
    assert len({s.id for s in sets}) == len(sets)


def test_cards_and_models_resolve_in_the_catalogs(sets):
    for s in sets:
        lookup_gpu(s.hardware.gpu)  # raises UnknownGpuError
        for p in s.points:
            from_catalog(s.model_of(p))  # raises ModelNotFoundError
            assert s.gpus_of(p) <= s.hardware.count, (s.id, p.label)


def test_measured_keys_are_bench_serve_keys(sets):
    for s in sets:
        for p in s.points:
            bad = [k for k in p.measured if not is_known_measured_key(k)]
            assert not bad, (s.id, p.label, bad)
            assert set(s.bench_of(p)) <= BENCH_OPTIONS, (s.id, p.label)


def test_comparisons_name_points_that_publish_the_figure(sets):
    for s in sets:
        labels = {p.label for p in s.points}
        for c in s.comparisons:
            assert set(c.points) <= labels, (s.id, c.name)
            assert all(c.figure in s.point(lab).measured for lab in c.points), (s.id, c.name)


def test_the_library_meets_its_size_targets(sets):
    assert len(sets) >= 21
    kinds = {lookup_gpu(s.hardware.gpu).name for s in sets}
    assert len(kinds) >= 8, kinds
    consumer = [s for s in sets if CONSUMER.match(lookup_gpu(s.hardware.gpu).name)]
    assert len(consumer) >= 11
    assert sum(s.hardware.count > 1 for s in consumer) >= 5  # multi-card desk rigs
    validation = sum(s.role == "validation" for s in sets)
    assert validation / len(sets) >= 0.33
    assert sum(s.role == "fit" for s in sets) >= 1
    assert sum(bool(s.comparisons) for s in sets) >= 13  # sets that compare flags / layouts on one machine


def test_no_set_cites_a_source_kept_aside(sets):
    for s in sets:
        assert forbidden_reason(s.source.repo, s.source.path, s.source.url) is None, s.id
    for f in FOLDER.glob("*.yaml"):  # the README names them, to say so
        text = f.read_text(encoding="utf-8").lower()
        assert "gpustack" not in text and "performance-lab" not in text, f.name
        assert "inference_results_v5.0" not in text, f.name


def test_forbidden_sources_are_recognised():
    assert forbidden_reason("gpustack/gpustack", "docs/performance-lab/x.md")
    assert forbidden_reason(None, None, "https://github.com/mlcommons/inference_results_v5.0/tree/main/open")
    assert forbidden_reason("vllm-project/vllm", "benchmarks/README.md") is None


_GOOD = """\
id: {id}
role: fit
title: t
source: {{kind: repo, repo: a/b, path: c.md, commit: {commit}, where: table 1, retrieved: 2026-01-01}}
hardware: {{gpu: H100 SXM, count: 1}}
model: meta-llama/Llama-3.1-8B
vllm_version: 0.10.1
bench: {{dataset_name: random, random_input_len: 1024}}
points:
  - label: a
    measured: {{output_throughput: 100.0}}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return f


def test_a_good_file_loads(tmp_path):
    s = load_set(_write(tmp_path, "x.yaml", _GOOD.format(id="x", commit="a" * 40)))
    assert s.points[0].measured["output_throughput"] == 100.0
    assert s.hardware.p2p is None  # the card's own; false where the source says the cards could not reach each other
    s = load_set(_write(tmp_path, "y.yaml", _GOOD.format(id="y", commit="a" * 40).replace("count: 1", "count: 1, p2p: false")))
    assert s.hardware.p2p is False


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("output_throughput", "tokens_per_second"), "points[0].measured"),
    (lambda t: t.replace("a" * 40, "abc"), "source.commit"),
    (lambda t: t.replace("random_input_len", "random-input-len"), "bench"),
    (lambda t: t.replace("role: fit", "role: train"), "role"),
    (lambda t: t.replace("count: 1", "count: 0"), "hardware.count"),
    (lambda t: t.replace("count: 1", "count: 1, p2p: maybe"), "hardware.p2p"),
    (lambda t: t + "comparisons:\n  - {name: c, points: [a, b], figure: output_throughput}\n", "comparisons[0].points"),
    (lambda t: t.replace("repo: a/b", "repo: gpustack/gpustack"), "source"),
    (lambda t: t + "colour: blue\n", "colour"),
])
def test_errors_name_the_file_and_the_field(tmp_path, edit, field):
    f = _write(tmp_path, "x.yaml", edit(_GOOD.format(id="x", commit="a" * 40)))
    with pytest.raises(RealRunError) as e:
        load_set(f)
    assert e.value.field == field
    assert str(e.value).startswith(f"{f}: {field}: ")


def test_an_id_other_than_the_stem_is_refused(tmp_path):
    f = _write(tmp_path, "x.yaml", _GOOD.format(id="y", commit="a" * 40))
    with pytest.raises(RealRunError, match=r"x\.yaml: id: 'y' differs"):
        load_set(f)


def test_broken_yaml_names_the_file(tmp_path):
    f = _write(tmp_path, "x.yaml", "id: [x\n")
    with pytest.raises(RealRunError, match=r"x\.yaml: .*broken YAML"):
        load_set(f)
