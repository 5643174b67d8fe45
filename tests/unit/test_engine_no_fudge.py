"""No per-set fudge in the performance model (issue 34 item 3): the engine that the
planner, the sim and the tuner share (``app/engine``) names no set of the library of
published GPU runs (``benchmarks/data/realgpu``) — not its id, not its source's
repository, path or URL. A term is justified by the kernel or scheduler it models,
never by the run it makes fit."""
from __future__ import annotations

from pathlib import Path

from app.planner.realruns import load_sets

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "benchmarks" / "data" / "realgpu"
ENGINE = ROOT / "app" / "engine"


def _needles() -> dict[str, str]:
    """lower-case text → what it is (a set id, a source repo/URL)."""
    out: dict[str, str] = {}
    for s in load_sets(FOLDER):
        out[s.id.lower()] = f"set id {s.id}"
        src = s.source
        if src.repo:
            out[src.repo.lower()] = f"source repository of {s.id}"
            out[src.repo.split("/")[0].lower()] = f"source owner of {s.id}"
        if src.url:
            out[src.url.lower().removeprefix("https://").removeprefix("http://").rstrip("/")] = f"source URL of {s.id}"
    return out


def test_the_engine_names_no_set_or_source_of_the_library():
    needles = _needles()
    assert len(needles) >= 10
    files = sorted(ENGINE.rglob("*.py"))
    assert files, "no engine sources found"
    hits = []
    for f in files:
        text = f.read_text(encoding="utf-8").lower()
        hits += [f"{f.relative_to(ROOT)}: {what} ({needle!r})" for needle, what in needles.items() if needle in text]
    assert not hits, "app/engine names sets of the real-GPU library (no per-set fudge):\n" + "\n".join(hits)
