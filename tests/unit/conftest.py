"""The unit tier (tests/plugins/tiers.py): no process, no Qt, no socket."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CASES


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama's config.json and tokenizer files (tests/cases/tiny-llama, no
    weights): what the planner reads of a local model, with no `make model`."""
    return CASES / "tiny-llama"
