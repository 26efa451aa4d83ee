"""DRA claims in a policy: the grant key of a claim's own CPUs, which claim a container uses, how
the containers sharing one split its CPU time, and the bookkeeping every policy offering devices
shares (ClaimHolder) (docs/dra.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from resmgr.model import Claim, Container, Decision, Pod, Resources, View
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.policies.toolkit.moves import SnapshotMoves
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


class ClaimHolder(SnapshotMoves):
    """Prepare, unprepare and release for a policy that holds each claim's CPUs as an entry of its
    own (keyed key(uid): a grant, a balloon member), listed before Policy among its bases. The
    policy sets `claims` and `unprepared` and gives _hold (take a claim's CPUs), _claim_users,
    _user_claim and _user_resources, besides SnapshotMoves' _snapshot, _remove and _updates."""

    claims: dict[str, Claim]  # prepared, by UID
    unprepared: set[str]  # unprepared while containers still run on their CPUs

    def _hold(self, claim: Claim) -> int:
        """Take the claim's CPUs on its device and return how many (PolicyError: nothing taken)."""
        raise NotImplementedError

    def _claim_users(self, uid: str) -> list[str]:
        """The keys of the containers running on the claim."""
        raise NotImplementedError

    def _user_claim(self, key: str) -> str:
        """The claim a container runs on ("": none)."""
        raise NotImplementedError

    def _user_resources(self, key: str, c: Container) -> Resources:
        """What a container running on a claim has now."""
        raise NotImplementedError

    def prepare_claim(self, claim: Claim, view: View) -> Decision:
        held = self.claims.get(claim.uid)
        if held is not None:
            if held.device != claim.device:
                raise PolicyError(f"{claim.who} is prepared on device {held.device}, not {claim.device}")
            self.unprepared.discard(claim.uid)
            return Decision()
        before = self._snapshot()
        count = self._hold(claim)
        self.claims[claim.uid] = replace(claim, cpus=count)
        return Decision(updates=self._updates(before, view, ""))

    def unprepare_claim(self, uid: str, view: View) -> Decision:
        if uid not in self.claims:
            return Decision()
        if self._claim_users(uid):  # still running on its CPUs: they go with the last of them
            self.unprepared.add(uid)
            return Decision()
        return self._drop_claim(uid, view)

    def _drop_claim(self, uid: str, view: View) -> Decision:
        before = self._snapshot()
        self._remove(key(uid))
        self.claims.pop(uid, None)
        self.unprepared.discard(uid)
        return Decision(updates=self._updates(before, view, ""))

    def _sharers(self, uid: str, view: View, skip: str = "") -> dict[str, Resources]:
        """The claim's users but skip, with their new part of its CPU time."""
        out = {}
        for k in self._claim_users(uid):
            c = view.containers.get(k)
            if k != skip and c is not None:
                out[k] = self._user_resources(k, c)
        return out

    def release(self, container: Container, view: View) -> Decision:
        uid = self._user_claim(container.key)
        decision = super().release(container, view)
        if not uid:
            return decision
        if not self._claim_users(uid) and uid in self.unprepared:
            decision.updates.update(self._drop_claim(uid, view).updates)
        decision.updates.update(self._sharers(uid, view))  # the rest of them get its CPU time
        return decision
