"""What a ResourceClaim (resource.k8s.io/v1) was allocated of this driver, as a model Claim."""

from __future__ import annotations

import math
from typing import Any

from resmgr.model import Claim
from resmgr.requests import RequirementError, parse_cpu


class ClaimError(Exception):
    """The claim cannot be prepared; the message says why, naming the claim."""


class ClaimGone(ClaimError):
    """The claim is not there any more: deleted, replaced by another object of its name, or no
    longer allocated a device of this driver (so no pod can use it here)."""


def claim(doc: Any, driver: str, uid: str) -> Claim:
    """The claim kubelet asked to prepare (uid: the object it meant) from the API server's copy."""
    try:
        return _claim(doc, driver, uid)
    except (AttributeError, TypeError) as err:  # a field of the wrong shape
        raise ClaimError(f"claim {uid}: not a ResourceClaim as resource.k8s.io/v1 has it ({err})") from None


def _claim(doc: dict[str, Any], driver: str, uid: str) -> Claim:
    meta = doc.get("metadata") or {}
    who = f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    if meta.get("uid") != uid:
        raise ClaimGone(f"{who} is another object now (UID {meta.get('uid')}, kubelet asked for {uid})")
    results = [r for r in (((doc.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
               or [] if r.get("driver") == driver]
    if not results:
        raise ClaimGone(f"{who} has no device of driver {driver} allocated")
    devices = sorted({r.get("device", "") for r in results})
    if len(devices) > 1:
        raise ClaimError(f"{who} was allocated devices {' and '.join(devices)} of driver {driver}: a claim takes "
                         "its CPUs from one device (ask for one, or use a claim per device)")
    cpus = 0
    for r in results:
        amount = (r.get("consumedCapacity") or {}).get("cpu")
        if amount is None:  # the whole device (no consumable capacity, or none asked)
            cpus = 0
            break
        try:
            cpus += math.ceil(parse_cpu(amount) / 1000)
        except RequirementError as err:
            raise ClaimError(f"{who}: consumed capacity cpu: {err}") from None
    requests = sorted({r.get("request", "") for r in results} - {""})
    return Claim(uid, meta.get("namespace", ""), meta.get("name", ""), devices[0], cpus, requests,
                 results[0].get("pool", ""))
