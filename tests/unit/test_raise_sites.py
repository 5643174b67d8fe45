"""The raise-site table (docs/vllm-raise-sites.md, written by scripts/vllm_raise_sites.py from
vLLM 0.32.0's source): every row marked covered has a wording in
tests/unit/test_diagnose_env.py ``SITE_WORDINGS`` that is the row's template filled in, and
the diagnosis gives it the row's kind and fix; the counts at the top agree with the rows."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from app.planner.diagnose import diagnose
from app.planner.plan import fix_to_flags
from tests.unit.test_diagnose_env import SITE_WORDINGS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from vllm_raise_sites import site_line  # noqa: E402

TABLE = Path(__file__).resolve().parents[2] / "docs" / "vllm-raise-sites.md"


def _rows() -> list[dict[str, str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| site ") or line.startswith("|---"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        site, exc, wording, kind, predicts, fix, reachable, covered = cells
        rows.append({"site": site, "exc": exc, "wording": wording, "kind": kind, "fix": fix,
                     "reachable": reachable.startswith("yes"), "covered": covered == "yes"})
    return rows


ROWS = _rows()
COVERED = [r for r in ROWS if r["covered"]]


def _template_rx(t: str) -> re.Pattern[str]:
    """The table's wording (cut at 220 characters) as a pattern: placeholders match anything."""
    t = re.sub(r"\{[^}]*$", "", t)  # a placeholder the cut left open
    parts = re.split(r"\{[^{}]*\}", t)
    return re.compile(".*?".join(re.escape(p) for p in parts), re.S)


def test_the_table_has_rows_and_its_counts_agree():
    assert len(ROWS) > 900 and COVERED
    text = TABLE.read_text()
    reach = [r for r in ROWS if r["reachable"]]
    assert f"- reachable: {len(reach)}\n" in text
    assert f"- reachable and covered (a test feeds the wording): {sum(r['covered'] for r in reach)} " in text


def test_every_covered_row_has_a_test_wording():
    missing = [r["site"] for r in COVERED if r["site"] not in SITE_WORDINGS]
    assert not missing, f"rows marked covered without a wording in SITE_WORDINGS: {missing}"


@pytest.mark.parametrize("row", COVERED, ids=[r["site"] for r in COVERED])
def test_a_covered_rows_wording_gets_its_kind_and_fix(row):
    wording, kind = SITE_WORDINGS[row["site"]]
    assert kind == row["kind"]
    assert _template_rx(row["wording"]).match(wording), "the test's wording is not the site's template"
    d = diagnose([site_line(row["exc"], wording)])
    assert d is not None and d.problem == kind
    shown = fix_to_flags(d.fix) if d.fix else d.explanation.split(":")[0][:90].strip()
    assert shown == row["fix"]
