"""topology-aware's pools and grants as `cri-resmgr status` shows them, and a persisted grant
checked against the pools of now before it is reinstated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.policies.toolkit.grants import Grant
from resmgr.policies.topology_aware.accounts import Accounts
from resmgr.policies.topology_aware.tree import Pool
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology


def describe_pools(topology: Topology, pools: list[Pool], accounts: Accounts,
                   grants: Iterable[Grant]) -> list[dict[str, Any]]:
    exclusive = [0] * len(pools)
    by_name = {p.name: p for p in pools}
    for g in grants:
        if g.exclusive:
            exclusive[by_name[g.pool].id] += 1
    return [pool_entry(topology, p.name, p.cpus, accounts.sharable(p),
                       parent=p.parent.name if p.parent else "", reserved=p.reserved,
                       isolated=p.isolated - accounts.taken, exclusive_grants=exclusive[p.id],
                       containers=accounts.count[p.id], requested=accounts.milli[p.id],
                       # what the pool's own shared CPUs can still give, its children's requests counted
                       free=1000 * len(accounts.sharable(p)) - accounts.subtree_milli(p),
                       # shared users running on an ancestor's or the reserved CPUs, none of the pool's own left
                       elsewhere=len(accounts.users[p.id]) if not accounts.sharable(p) else 0,
                       mems=p.all_mems, memory={t.value: p.memory[t] for t in sorted(p.memory)})
            for p in pools]


def describe_grant(g: Grant, cpus: CPUSet, pool: Pool, accounts: Accounts) -> dict[str, Any]:
    """cpus: the CPUs of the grant (a claim's, for a grant on one)."""
    doc: dict[str, Any] = {"pool": g.pool, "exclusive": str(g.exclusive), "shared_milli": g.shared, "kind": g.kind}
    if g.claim:
        doc.update(claim=g.claim, exclusive=str(cpus))
    if g.on_shared and not accounts.sharable(pool):
        doc["fallback"] = "reserved" if accounts.lender(pool) is None else "parent"
    return doc


def restored(key: str, g: Grant, reserved_pool: Pool | None, by_name: Mapping[str, Pool], taken: CPUSet) -> Grant:
    """The persisted grant g of key as it is reinstated now (PolicyError: it cannot be)."""
    if g.reserved:
        if reserved_pool is None:
            raise PolicyError(f"grant of {key} is on reserved CPUs; none are reserved now")
        g = replace(g, pool=reserved_pool.name, mem_pool="")
    pool = by_name.get(g.pool)
    if pool is None:
        raise PolicyError(f"grant of {key} is in pool {g.pool!r}, which does not exist now")
    if g.mem_pool and g.mem_pool not in by_name:
        g = replace(g, mem_pool="")
    if not g.exclusive <= pool.cpus - pool.reserved:
        raise PolicyError(f"grant of {key} holds CPUs {g.exclusive - (pool.cpus - pool.reserved)} outside "
                          f"pool {pool.name}'s unreserved CPUs")
    if not g.exclusive.isdisjoint(taken):
        raise PolicyError(f"grant of {key} holds CPUs {g.exclusive & taken} another grant holds")
    return g
