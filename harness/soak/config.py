"""The soak's configurations, as an operator changes them through the cluster: ResourceManagerConfig
objects `default` and `group.<name>` in kube-system, and the node's group label that picks one. A
change is an option of the policy in force, the node moved to another group of the same policy, or
a policy switch (to the group of another policy); a broken configuration is one every node rejects."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi

from harness.soak.judge import Expect
from resmgr.agent import resources as rs
from resmgr.topology.cpuset import CPUSet

NS = "kube-system"
GROUP_LABEL = "cri-resource-manager.intel.com/group"
RESERVED = "cpuset:0"
MAX_BALLOON = 6

TOPOLOGY_AWARE: dict[str, Any] = {"policy": {
    "Active": "topology-aware", "ReservedResources": {"cpu": RESERVED},
    "topology-aware": {"ColocatePods": False}}}
BALLOONS: dict[str, Any] = {"policy": {
    "Active": "balloons", "ReservedResources": {"cpu": RESERVED},
    "balloons": {"AllocatorTopologyBalancing": True,
                 "BalloonTypes": [{"Name": "soak", "Namespaces": ["*"], "MaxCPUs": MAX_BALLOON}]}}}
STATIC: dict[str, Any] = {"policy": {"Active": "static", "ReservedResources": {"cpu": RESERVED}}}
PODPOOL = "soak"  # the pool type the load's annotated pods ask for (harness/soak/load.py)
PODPOOLS: dict[str, Any] = {"policy": {
    "Active": "podpools", "ReservedResources": {"cpu": RESERVED},
    "podpools": {"Pools": [{"Name": PODPOOL, "CPU": 2, "MaxPods": 3, "Instances": 3}]}}}
# The option each policy's change toggles (a policy without one is switched away from instead).
OPTION = {"topology-aware": ("topology-aware", "ColocatePods"), "balloons": ("balloons", "AllocatorTopologyBalancing"),
          "static": ("static", "RelaxedIsolation")}
# The group each label value names (None: no label, the default object).
GROUPS: dict[str | None, dict[str, Any]] = {None: TOPOLOGY_AWARE, "soak-ta": TOPOLOGY_AWARE, "soak-bl": BALLOONS,
                                            "soak-st": STATIC, "soak-pp": PODPOOLS}
START = {"topology-aware": None, "balloons": "soak-bl", "static": "soak-st", "podpools": "soak-pp"}

FALLBACK = """policy:
  Active: topology-aware
  ReservedResources:
    cpu: cpuset:0
"""


def expect_of(spec: dict[str, Any]) -> Expect:
    policy = spec["policy"]["Active"]
    return Expect(policy, CPUSet.parse(RESERVED.removeprefix("cpuset:")),
                  MAX_BALLOON if policy == "balloons" else 0)


def object_name(group: str | None) -> str:
    return f"group.{group}" if group else "default"


@dataclass
class Configs:
    """The cluster side of the node's configuration, and what the node is expected to run."""

    core: CoreV1Api
    custom: CustomObjectsApi
    node: str
    rng: random.Random
    group: str | None = None
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name, as written
    log: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, what changed)

    def setup(self, policy: str = "topology-aware") -> None:
        """Every group's object written, the node in the group of policy."""
        for group, spec in GROUPS.items():
            self.write(object_name(group), copy.deepcopy(spec))
        self.label(START[policy])

    @property
    def in_force(self) -> str:
        return object_name(self.group)

    def spec(self) -> dict[str, Any]:
        return self.specs[self.in_force]

    def expect(self) -> Expect:
        return expect_of(self.spec())

    def write(self, name: str, spec: dict[str, Any]) -> None:
        args = (rs.GROUP, rs.VERSION, NS, rs.PLURAL)
        body = {"apiVersion": f"{rs.GROUP}/{rs.VERSION}", "kind": rs.KIND, "metadata": {"name": name}, "spec": spec}
        for attempt in range(10):
            try:
                old = self.custom.get_namespaced_custom_object(*args, name)
            except ApiException as err:
                if err.status != 404:
                    raise
                self.custom.create_namespaced_custom_object(*args, body)
                break
            body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            try:
                self.custom.replace_namespaced_custom_object(*args, name, body)
                break
            except ApiException as err:  # the agents' status writes moved it on: again, as kubectl does
                if err.status != 409 or attempt == 9:
                    raise
                time.sleep(0.2)
        self.specs[name] = spec

    def generation(self, name: str) -> int:
        obj = self.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, name)
        return int(obj["metadata"]["generation"])

    def label(self, group: str | None) -> None:
        self.core.patch_node(self.node, {"metadata": {"labels": {GROUP_LABEL: group}}})
        self.group = group

    def change(self, before: Callable[[str], None] = lambda policy: None) -> str:
        """One change of the three kinds, chosen at random (the first a policy switch, so that even a
        short run has one); what it was. before(policy) is called before a switch to policy is written."""
        kind = self.rng.choice(["option", "group", "switch"])
        if not any("policy switch" in what for _, what in self.log):
            kind = "switch"
        if kind == "option" and self.spec()["policy"]["Active"] in OPTION:
            spec = copy.deepcopy(self.spec())
            section, key = OPTION[spec["policy"]["Active"]]
            spec["policy"].setdefault(section, {})[key] = not spec["policy"].get(section, {}).get(key, False)
            self.write(self.in_force, spec)
            what = f"{self.in_force}: {key} {spec['policy'][section][key]}"
        elif kind == "group" and self.group in (None, "soak-ta"):  # topology-aware in both groups
            self.label(None if self.group else "soak-ta")
            what = f"group label {self.group or '(none)'}"
        else:
            policy = self.rng.choice(sorted(p for p in START if p != self.spec()["policy"]["Active"]))
            before(policy)
            self.label(START[policy])
            what = f"policy switch to {self.spec()['policy']['Active']} (group {self.group})"
        self.log.append((time.monotonic(), what))
        return what

    def break_it(self) -> dict[str, Any]:
        """The configuration in force made one every node rejects; the good one, to put back."""
        good = self.spec()
        bad = copy.deepcopy(good)
        bad["policy"]["ReservedResources"] = {"cpu": "cpuset:99"}  # no such CPU on any node
        self.write(self.in_force, bad)
        self.specs[self.in_force] = good  # what the node keeps running
        return good

    def node_status(self) -> dict[str, Any]:
        try:
            obj = self.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.NODE_PLURAL, self.node)
        except ApiException as err:
            if err.status == 404:
                return {}
            raise
        return obj.get("status") or {}

    def status_current(self, rejected: bool = False) -> str:
        """"" when the node's status reports the object in force at its generation (applied, or
        rejected when expected so) and no problem; else what is off."""
        st = self.node_status()
        want = self.in_force
        gen = self.generation(self.in_force)
        outcome = rs.FAILURE if rejected else rs.SUCCESS
        if st.get("name") != want or int(st.get("generation") or 0) != gen or st.get("status") != outcome:
            return (f"node status {st.get('name')} generation {st.get('generation')} {st.get('status')}; "
                    f"expected {want} generation {gen} {outcome}")
        if st.get("problems"):
            return f"node status reports problems: {st['problems']}"
        return ""
