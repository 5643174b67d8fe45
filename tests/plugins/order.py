"""The order of a tier's tests under pytest-xdist: the tests marked ``long(seconds)`` (their
measured wall time on 2 cores) open the workers' first chunks, so that none of them is
left for the end of the run while the other workers wait (the integration tier's tail was
one 168 s test started last)."""
from __future__ import annotations

import os

import pytest


def long_first_chunks(items: list, workers: int) -> list:
    """``items`` reordered so that each of ``workers`` contiguous chunks (how xdist's
    ``--dist worksteal`` hands out its first work: each worker in turn takes len(pending) //
    (workers left) from the front, xdist/scheduler/worksteal.py)
    starts with its share of the tests marked ``long(seconds)``, dealt longest first to the
    chunk with the fewest seconds so far; the other tests keep their order. A long test
    at the end of a chunk was the tier's tail: the others had finished and waited on it."""
    longs = sorted((it for it in items if it.get_closest_marker("long")),
                   key=lambda it: -float(it.get_closest_marker("long").args[0]))
    if workers < 2 or not longs:
        return items
    n_all = len(items)
    size, left = [], n_all  # xdist's split: each idle worker len(pending) // workers still to serve
    for j in range(workers):
        size.append(left // (workers - j))
        left -= size[-1]
    heads: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for it in longs:
        j = min(range(workers), key=lambda k: (load[k], k))
        heads[j].append(it)
        load[j] += float(it.get_closest_marker("long").args[0])
    rest = iter([it for it in items if not it.get_closest_marker("long")])
    out = []
    for j in range(workers):
        out += heads[j]
        out += [next(rest) for _ in range(max(0, size[j] - len(heads[j])))]
    out += list(rest)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(session, config, items):
    """Under xdist, deal the ``long`` tests to the start of each worker's first chunk —
    after every other implementation (``-m`` deselection included), so the chunks are cut
    from what runs. Every worker computes the same order (xdist requires it)."""
    yield
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    items[:] = long_first_chunks(items, workers)
