"""Choosing CPUs: whole cores, then the tightest cache and NUMA domain, and core kinds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resmgr.policies.toolkit.allocator import AllocationError, Preferences, take_cpus
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import CoreKind
from tests.support.machines import machine

# 2 sockets x 8 cores x 2 threads: socket 0 = 0-7,16-23; socket 1 = 8-15,24-31
SERVER = machine("sockets=2,cores=8,threads=2")


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



HYBRID = machine("cores=8,threads=2,ecores=8,ecluster=4,numbering=linear")  # P 0-15 (pairs), E 16-23
CCX = machine("sockets=2,cores=16,threads=2,l3=4")  # 4 L3 domains of 4 cores per socket
SNC = machine("sockets=2,nodes=2,cores=14,threads=2")


def test_levels_that_nest():
    assert [lv.name for lv in HYBRID.hierarchy] == ["l2", "core"]
    assert [lv.name for lv in CCX.hierarchy] == ["package", "l3", "core"]
    assert [lv.name for lv in SNC.hierarchy] == ["package", "node", "core"]


def test_core_kind_preference_and_l2_clusters():
    p, e = Preferences(kind=CoreKind.PERFORMANCE), Preferences(kind=CoreKind.EFFICIENT)
    assert take_cpus(HYBRID, HYBRID.online, 4, p) == CPUSet.parse("0-3")
    assert take_cpus(HYBRID, HYBRID.online, 4, e) == CPUSet.parse("16-19")  # one L2 cluster
    assert take_cpus(HYBRID, HYBRID.online - CPUSet([16]), 3, e) == CPUSet.parse("17-19")
    assert take_cpus(HYBRID, HYBRID.online - CPUSet([16]), 4, e) == CPUSet.parse("20-23")
    # Too few of the preferred kind: the other kind alone, then both.
    assert take_cpus(HYBRID, CPUSet.parse("0-1,16-23"), 4, p) == CPUSet.parse("16-19")
    assert take_cpus(HYBRID, CPUSet.parse("0-1,16-17"), 4, p) == CPUSet.parse("0-1,16-17")
    # Whole cores first: two lone P threads lose to two E-cores; too few of both kinds make a mix.
    assert take_cpus(HYBRID, CPUSet.parse("0,2,16-17"), 2, p) == CPUSet.parse("16-17")
    assert take_cpus(HYBRID, CPUSet.parse("0-1,16,20"), 3, p) == CPUSet.parse("0-1,16")


def test_l2_cache_clusters_of_a_generated_machine_are_placed_by():
    """`--machine ...,l2=2`: two cores of a node share an L2 (nri-plugins' cache-cluster machines)."""
    clusters = machine("sockets=1,nodes=2,cores=4,threads=2,l2=2")  # node 0: cores 0-3, node 1: 4-7
    assert sorted(str(c) for c in set(clusters.l2_of.values())) == ["0-1,8-9", "2-3,10-11", "4-5,12-13",
                                                                    "6-7,14-15"]
    assert "l2" in [lv.name for lv in clusters.hierarchy]
    assert take_cpus(clusters, clusters.online, 4) == CPUSet.parse("0-1,8-9")  # one whole cluster
    assert take_cpus(clusters, clusters.online - CPUSet([0]), 4) == CPUSet.parse("2-3,10-11")
    assert take_cpus(clusters, clusters.online - CPUSet([0]), 2) == CPUSet.parse("1,9")  # its other core


def test_one_l3_domain_before_spreading():
    assert take_cpus(CCX, CCX.online, 8) == CPUSet.parse("0-3,32-35")
    # The fullest domain that still holds the request: 6 CPUs fit the one with 7 free.
    assert take_cpus(CCX, CCX.online - CPUSet([0]), 6) == CPUSet.parse("1-3,33-35")
    assert take_cpus(CCX, CCX.online - CPUSet([0]), 8) == CPUSet.parse("4-7,36-39")


def test_whole_cores_before_one_node():
    # Each node of socket 0 has one whole core left and single threads whose siblings are taken: a
    # 4-CPU request takes the two whole cores, one in each node, rather than one core and two threads
    # that share their cores with other containers.
    avail = CPUSet.parse("56-83") | CPUSet.parse("0,14")  # second threads of nodes 0-1, cores 0 and 14 whole
    assert take_cpus(SNC, avail, 4) == CPUSet.parse("0,14,56,70")
    assert take_cpus(SNC, avail, 2) == CPUSet.parse("0,56")  # one node when it holds a whole core


def test_spread_on_physical_cores_and_balance():
    one_each = take_cpus(SERVER, SERVER.online, 4, Preferences(spread_cores=True))
    assert len({SERVER.core_of[c] for c in one_each}) == 4 and one_each <= SERVER.packages[0]
    busy = SERVER.online - CPUSet([8, 24])  # socket 1 is in use
    assert take_cpus(SERVER, busy, 2) <= SERVER.packages[1]  # packed
    assert take_cpus(SERVER, busy, 2, Preferences(balance=True)) <= SERVER.packages[0]  # spread
