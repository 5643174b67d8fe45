"""One build of an expensive fixture per test run, shared by pytest-xdist's workers.

Under ``--dist worksteal`` the tests of one module are spread over several workers as
they steal work, and a ``scope="module"`` fixture is then built once per worker that runs
one of them: the integration tier's what-if capacity search (a sim run of ≈ 40 s on 2
cores) was built twice in one run. :func:`once_per_run` builds the result once, under a
file lock in the run's shared temp folder, and every other worker (or module) waits for
it and reads it back."""
from __future__ import annotations

import fcntl
import os
import pickle
from pathlib import Path
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp folder of this test run that all its xdist workers share: the parent of
    each worker's base temp folder (``pytest-N/popen-gwK``) under xdist, the base temp
    folder itself without it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, key: str, build: Callable[[Path], T]) -> T:
    """``build(folder)`` once per test run for ``key``: the first caller builds in
    ``folder`` (a folder of the run's shared temp folder, ``shared-<key>``, which the
    result may name) and stores the result (pickled) beside it; a caller on another worker
    waits for the build and gets the stored result. A build that raised is built again by
    the next caller (its exception is not stored), so each worker's tests report it."""
    root = run_folder(tmp_path_factory)
    folder = root / f"shared-{key}"
    done = root / f"shared-{key}.pickle"
    with open(root / f"shared-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.exists():
            with open(done, "rb") as f:
                return pickle.load(f)
        folder.mkdir(exist_ok=True)
        result = build(folder)
        tmp = done.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(result, f)
        tmp.replace(done)
        return result
