#!/usr/bin/env python3
"""Write the Helm chart's CRDs: the configuration (its spec from config/schemas/*.schema.json)
and each node's status.

The checked-in files must equal this output (a unit test compares them); run it after
changing a schema: `.venv/bin/python scripts/crd.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resmgr.agent import resources as r  # noqa: E402
from resmgr.config.document import MODULES, SCHEMA_DIR  # noqa: E402
from resmgr.config.openapi import ANY, convert  # noqa: E402

CRDS = Path(__file__).resolve().parent.parent / "deployment" / "helm" / "cri-resmgr" / "crds"
PATH = CRDS / f"{r.PLURAL}.yaml"
NODE_PATH = CRDS / f"{r.NODE_PLURAL}.yaml"

OUTCOME = {
    "generation": {"type": "integer", "description": "metadata.generation of the configuration judged."},
    "status": {"type": "string", "enum": [r.SUCCESS, r.FAILURE]},
    "error": {"type": "string", "description": "Why it was rejected: the key path and the problem."},
    "timestamp": {"type": "string", "format": "date-time"},
}


def spec_schema() -> dict[str, Any]:
    props = {}
    for module in MODULES:
        schema = json.loads((SCHEMA_DIR / f"{module}.schema.json").read_text())
        props[module] = convert(schema)
    return {"type": "object", **ANY, "properties": props,
            "description": "The configuration, section by section, as in a cri-resmgr configuration file. "
                           "Unknown keys are kept and reported by the nodes that judge them."}


def crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": "cri-resmgr configuration for the nodes it names: default, group.<GROUP> (nodes with "
                       "that group label) or node.<NODE>; the most specific one wins.",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": {"type": "object",
                       "description": "Written by the tally from the nodes' ResourceManagerNodeStatus objects.",
                       "properties": {
                           "observedGeneration": {"type": "integer",
                                                  "description": "The generation the counts are about."},
                           "success": {"type": "integer", "description": "Nodes running this generation."},
                           "failure": {"type": "integer", "description": "Nodes that rejected this generation."},
                           "pending": {"type": "integer",
                                       "description": "Nodes on this configuration that have not judged this "
                                                      "generation yet."},
                           "failures": {"type": "array", "maxItems": r.FAILURES_LISTED,
                                        "description": f"Nodes that rejected it, and why (the first "
                                                       f"{r.FAILURES_LISTED} by name; all of them: kubectl get "
                                                       f"rmstatus -l {r.STATUS_LABEL}={r.FAILURE}).",
                                        "items": {"type": "object", "required": ["node", "generation", "error"],
                                                  "properties": {"node": {"type": "string"}, **OUTCOME}}}}},
        },
    }
    columns = [
        {"name": "Policy", "type": "string", "jsonPath": ".spec.policy.Active"},
        {"name": "Success", "type": "integer", "jsonPath": ".status.success"},
        {"name": "Failure", "type": "integer", "jsonPath": ".status.failure"},
        {"name": "Pending", "type": "integer", "jsonPath": ".status.pending"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return definition(r.KIND, r.PLURAL, r.SINGULAR, r.SHORT_NAMES, schema, columns, {"status": {}})


def node_crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": "What one node runs: the configuration in force there and whether its cri-resmgr took it. "
                       "Named after the node, written by its agent alone, owned by the Node.",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
            "status": {"type": "object", "required": ["kind", "name", "status", "timestamp"], "properties": {
                "kind": {"type": "string", "enum": [r.KIND, "ConfigMap"]},
                "name": {"type": "string", "description": "The configuration's name in its namespace."},
                "resourceVersion": {"type": "string"}, **OUTCOME,
                "problems": {"type": "array", "items": {"type": "string"},
                             "description": "What the node's cri-resmgr reports is wrong beyond its configuration "
                                            "(its state cannot be written, say); absent while all is well."}}},
        },
    }
    columns = [
        {"name": "Kind", "type": "string", "jsonPath": ".status.kind"},
        {"name": "Config", "type": "string", "jsonPath": ".status.name"},
        {"name": "Generation", "type": "integer", "jsonPath": ".status.generation"},
        {"name": "Status", "type": "string", "jsonPath": ".status.status"},
        {"name": "Error", "type": "string", "jsonPath": ".status.error", "priority": 1},
        {"name": "Problems", "type": "string", "jsonPath": ".status.problems", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return definition(r.NODE_KIND, r.NODE_PLURAL, r.NODE_SINGULAR, r.NODE_SHORT_NAMES, schema, columns, {})


def definition(kind: str, plural: str, singular: str, short: list[str], schema: dict[str, Any],
               columns: list[dict[str, Any]], subresources: dict[str, Any]) -> dict[str, Any]:
    version: dict[str, Any] = {"name": r.VERSION, "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": schema}}
    if subresources:
        version["subresources"] = subresources
    version["additionalPrinterColumns"] = columns
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{r.GROUP}"},
        "spec": {"group": r.GROUP, "scope": "Namespaced",
                 "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular,
                           "shortNames": short},
                 "versions": [version]},
    }


def generated(node: bool = False) -> str:
    head = "# Generated by scripts/crd.py from config/schemas; do not edit.\n"
    return head + yaml.safe_dump(node_crd() if node else crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    PATH.write_text(generated())
    NODE_PATH.write_text(generated(node=True))
