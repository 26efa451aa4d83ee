"""DRA claims in a policy: the grant key of a claim's own CPUs, which claim a container uses, and
how the containers sharing one split its CPU time (docs/dra.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from resmgr.model import Claim, Container, Pod
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.requests import milli_to_shares

PREFIX = "claim:"


def key(uid: str) -> str:
    """The grant key of a claim's own CPUs (never a container's)."""
    return PREFIX + uid


def is_claim(grant_key: str) -> bool:
    return grant_key.startswith(PREFIX)


def claim_of(container: Container, pod: Pod, claims: Mapping[str, Claim]) -> Claim | None:
    """The prepared claim the container runs on; None: it uses no claim. PolicyError when it uses
    several (one container, one set of CPUs) or one this node has not prepared."""
    if not container.claims:
        return None
    who = f"container {pod.namespace}/{pod.name}/{container.name}"
    if len(set(container.claims)) > 1:
        named = [claims[u].who if u in claims else f"claim {u}" for u in sorted(set(container.claims))]
        raise PolicyError(f"{who} uses {' and '.join(named)}: a container can take its CPUs from one claim only")
    uid = container.claims[0]
    claim = claims.get(uid)
    if claim is None:
        raise PolicyError(f"{who} uses claim {uid}, which is not prepared on this node")
    return claim


def shares(cpus: int, users: int) -> int:
    """Each user's CPU shares: the claim's CPUs split evenly among the containers using it."""
    return milli_to_shares(1000 * cpus // max(users, 1))


def restore(data: Mapping[str, Any]) -> tuple[dict[str, Claim], set[str]]:
    """Persisted claim records and the UIDs unprepared while containers still used them."""
    claims = {uid: Claim.from_dict(d) for uid, d in (data.get("claims") or {}).items()}
    return claims, set(data.get("unprepared") or ()) & set(claims)


def export(claims: Mapping[str, Claim], unprepared: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if claims:
        out["claims"] = {uid: c.to_dict() for uid, c in sorted(claims.items())}
    if unprepared:
        out["unprepared"] = sorted(unprepared)
    return out
