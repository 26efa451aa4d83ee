"""The topology-compact CPU allocator."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.allocator import AllocationError, take_cpus
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.sysfs import discover

# 2 sockets x 8 cores x 2 threads: socket 0 = 0-7,16-23; socket 1 = 8-15,24-31
SERVER = discover(generate(parse_spec("sockets=2,cores=8,threads=2"), tempfile.mkdtemp(prefix="crirm-topo-")))


@pytest.fixture
def server():
    return SERVER


def test_whole_package_first(server):
    assert take_cpus(server, server.online, 16) == server.packages[0]
    assert take_cpus(server, server.online - CPUSet([0]), 16) == server.packages[1]


def test_whole_cores_before_threads(server):
    assert take_cpus(server, server.online, 2) == CPUSet([0, 16])
    assert take_cpus(server, server.online, 3) == CPUSet([0, 16, 1])


def test_single_threads_break_fewest_idle_cores(server):
    # CPU 16's sibling 0 is gone: a single CPU should come from that half-used core.
    assert take_cpus(server, server.online - CPUSet([0]), 1) == CPUSet([16])


def test_prefers_fuller_package(server):
    # Socket 1 has fewer free CPUs: small requests go there, keeping socket 0 whole.
    avail = server.online - CPUSet([8, 9, 24, 25])
    assert take_cpus(server, avail, 2) <= server.packages[1]


def test_errors(server):
    with pytest.raises(AllocationError, match="need 40 CPUs, only 32"):
        take_cpus(server, server.online, 40)
    assert take_cpus(server, server.online, 0) == CPUSet()


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 31), min_size=1), st.data())
def test_takes_exactly_n_from_available(avail_ids, data):
    topo = SERVER
    avail = CPUSet(avail_ids)
    n = data.draw(st.integers(0, len(avail)))
    got = take_cpus(topo, avail, n)
    assert len(got) == n and got <= avail
    assert take_cpus(topo, avail, n) == got  # deterministic

