"""The multinode tier's bed: two network namespaces with an SSH server each
(tests/netns.py), one per pytest process for the whole session — the tier runs on
xdist workers (the Makefile's `make multinode`), each with a bed of its own."""
from __future__ import annotations

import os

import pytest

from tests import netns


@pytest.fixture(scope="session")
def bed():
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    b = netns.Bed.make(2)
    try:
        yield b
    finally:
        b.close()
    assert not any(h.ns in os.popen("ip netns list").read() for h in b.hosts)
    links = os.popen("ip -o link").read()
    assert b.bridge not in links and not any(h.veth + "@" in links for h in b.hosts)
