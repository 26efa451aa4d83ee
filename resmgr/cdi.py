"""The CDI devices that stand for prepared DRA claims (Container Device Interface, spec 0.6).

kubelet passes the CDI device names a DRA driver answered for a claim to the runtime with every
container that uses the claim: in the CRI CreateContainer request and, from containerd 2.3 on, in
what NRI plugins see of the container. A claim's device is `<KIND>=<claim UID>`, so a front end
tells from a container's CDI devices which claims it uses. The runtime resolves each name from a
spec file in its CDI directories, so one is written per claim: it sets an environment variable
naming the claim's CPUs (a device must edit the container somehow to be valid).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

VENDOR = "cri-resource-manager.intel.com"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
VERSION = "0.6.0"
ENV_PREFIX = "CRI_RESMGR_CLAIM_CPUS_"


def device_id(uid: str) -> str:
    """The fully qualified CDI device name of a claim."""
    return f"{KIND}={uid}"


def claim_uids(names: Iterable[str]) -> list[str]:
    """The claim UIDs among a container's CDI device names (other vendors' devices left out)."""
    prefix = KIND + "="
    return [n[len(prefix):] for n in names if n.startswith(prefix) and len(n) > len(prefix)]


_SPEC_PREFIX, _SPEC_SUFFIX = f"{VENDOR}-{CLASS}-", ".json"


def spec_file(uid: str) -> str:
    """The spec file's name in a CDI directory (the vendor and class first, as CDI suggests)."""
    return f"{_SPEC_PREFIX}{uid}{_SPEC_SUFFIX}"


def spec_uid(file_name: str) -> str | None:
    """The claim UID of one of our spec files' names (None: not ours)."""
    if file_name.startswith(_SPEC_PREFIX) and file_name.endswith(_SPEC_SUFFIX):
        return file_name[len(_SPEC_PREFIX):-len(_SPEC_SUFFIX)] or None
    return None


# The prepared claim (model.Claim as JSON) in its spec's annotations: a second record of it on the
# node, from which a daemon whose state file was lost holds the claim again (kubelet will not ask).
CLAIM_ANNOTATION = f"{VENDOR}/claim"


def spec(uid: str, cpus: str, claim: dict[str, Any] | None = None) -> dict[str, Any]:
    """The spec of one claim's device, the claim itself in its annotations."""
    doc: dict[str, Any] = {"cdiVersion": VERSION, "kind": KIND,
                           "devices": [{"name": uid, "containerEdits": {"env": [f"{env_name(uid)}={cpus}"]}}]}
    if claim is not None:
        doc["annotations"] = {CLAIM_ANNOTATION: json.dumps(claim, sort_keys=True)}
    return doc


def spec_claim(doc: Any) -> dict[str, Any] | None:
    """The claim a spec of ours records (None: an older spec, or not one of ours)."""
    text = ((doc.get("annotations") if isinstance(doc, dict) else None) or {}).get(CLAIM_ANNOTATION)
    try:
        claim = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return claim if isinstance(claim, dict) else None


def env_name(uid: str) -> str:
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", uid).upper()
