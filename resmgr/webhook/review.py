"""AdmissionReview (admission.k8s.io/v1) in, AdmissionReview with a JSON patch out.

Pure functions over the decoded JSON: no I/O, so every case is tested directly as well
as over TLS. The webhook never denies a pod; a request it cannot use is answered with
an error status code (the API server then applies the failure policy, Ignore).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from resmgr.requests import RESOURCES_ANNOTATION

API_VERSION = "admission.k8s.io/v1"
# The API server refuses an object whose annotations, keys and values together, exceed this.
MAX_ANNOTATIONS = 256 * 1024


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer (HTTP 400)."""


def _pointer(key: str) -> str:
    """A JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def resources_of(pod: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each container's and init container's requests and limits, by container name, as the
    engine reads them back (resmgr/requests.py); containers that ask for nothing are left out."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for field in ("initContainers", "containers"):
        containers = spec.get(field) or []
        if not isinstance(containers, list):
            continue
        for c in containers:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                continue
            res = c.get("resources") if isinstance(c.get("resources"), dict) else {}
            entry = {kind: dict(res[kind]) for kind in ("requests", "limits") if isinstance(res.get(kind), dict)
                     and res[kind]}
            if entry:
                out[c["name"]] = entry
    return out


def patch_for(pod: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON patch that writes the annotation (none when no container asks for anything),
    and warnings for the API server to show the user."""
    resources = resources_of(pod)
    if not resources:
        return [], []
    value = json.dumps(resources, separators=(",", ":"), sort_keys=True)
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else None
    annotations = meta.get("annotations") if meta is not None else None
    others = {k: v for k, v in (annotations or {}).items() if k != RESOURCES_ANNOTATION} \
        if isinstance(annotations, dict) else {}
    size = sum(len(str(k)) + len(str(v)) for k, v in others.items()) + len(RESOURCES_ANNOTATION) + len(value)
    if size > MAX_ANNOTATIONS:
        return [], [f"cri-resmgr-webhook: {RESOURCES_ANNOTATION} not written: the pod's annotations would take "
                    f"{size} bytes, over the {MAX_ANNOTATIONS} the API server accepts"]
    if meta is None:
        return [{"op": "add", "path": "/metadata", "value": {"annotations": {RESOURCES_ANNOTATION: value}}}], []
    if not isinstance(annotations, dict):
        return [{"op": "add", "path": "/metadata/annotations", "value": {RESOURCES_ANNOTATION: value}}], []
    # "add" replaces a member that exists: a value set by hand never outlives the spec.
    return [{"op": "add", "path": f"/metadata/annotations/{_pointer(RESOURCES_ANNOTATION)}", "value": value}], []


def _is_pod_create(req: dict[str, Any]) -> bool:
    kind = req.get("kind") if isinstance(req.get("kind"), dict) else {}
    resource = req.get("resource") if isinstance(req.get("resource"), dict) else {}
    return (kind.get("group", "") == "" and kind.get("kind") == "Pod" and resource.get("resource") == "pods"
            and not req.get("subResource") and req.get("operation") == "CREATE")


def answer(body: bytes) -> dict[str, Any]:
    """The AdmissionReview answering body; BadReview when it is not a v1 AdmissionReview."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise BadReview(f"body is not JSON: {err}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("body is not an AdmissionReview")
    if review.get("apiVersion") != API_VERSION:
        raise BadReview(f"AdmissionReview {review.get('apiVersion')!r} is not supported; configure the webhook "
                        f"with admissionReviewVersions: [v1]")
    req = review.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise BadReview("AdmissionReview without a request uid")
    response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    obj = req.get("object")
    if _is_pod_create(req) and isinstance(obj, dict):
        patch, warnings = patch_for(obj)
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        if warnings:
            response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
