"""The soak's load: pods made and deleted through the API all the time, of every kind kubelet
hands cri-resmgr - Guaranteed of 1, 2 and 4 CPUs, Burstable with and without limits, BestEffort,
pods of several containers, pods whose CPUs a DRA claim gives them (kube-scheduler allocates it, while
the policy in force offers devices) - and in-place resizes of running ones, up and down; kept inside
what the node can hold, so that kubelet refuses nothing and every pod made must run. The soak's
crowd (harness/soak/run.py) goes past the exclusive budget on purpose, up to what kubelet admits,
until cri-resmgr refuses a pod."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiException, CoreV1Api

from harness.images import BUSYBOX_IMAGE
from harness.soak.config import PODPOOL

NAMESPACE = "default"
MILLI = 1000


@dataclass(frozen=True)
class Part:
    """One container: requests (and limits) in milli-CPUs and MiB; limits 0: none."""

    cpu: int = 0
    memory: int = 0
    cpu_limit: int = 0
    memory_limit: int = 0


# Each kind of pod, its containers and how often it comes.
KINDS: dict[str, tuple[tuple[Part, ...], int]] = {
    "g1": ((Part(1000, 32, 1000, 32),), 4),
    "g2": ((Part(2000, 32, 2000, 32),), 3),
    "g4": ((Part(4000, 32, 4000, 32),), 1),
    "bl": ((Part(200, 32, 1000, 64),), 3),  # Burstable, limited
    "bn": ((Part(300, 16),), 3),  # Burstable without limits
    "be": ((Part(),), 3),
    "m2": ((Part(1000, 32, 1000, 32), Part(1000, 32, 1000, 32)), 1),  # Guaranteed, two containers
    "mb": ((Part(200, 16, 500, 32), Part(), Part(100)), 1),  # Burstable, three containers
    "gi": ((Part(1000, 32, 1000, 32),), 1),  # Guaranteed, after an init container of 1 CPU of its own
    "si": ((Part(100, 16),), 1),  # Burstable, beside a sidecar (an init container that keeps running)
    "dc": ((Part(100, 16),), 2),  # Burstable, on CPUs of one NUMA node it claims (CLAIM_CPUS of them)
}
# The init containers of a kind: (resources, a sidecar: restartPolicy Always, runs all along).
INIT: dict[str, tuple[Part, bool]] = {"gi": (Part(1000, 32, 1000, 32), False), "si": (Part(100, 16), True)}
EXCLUSIVE_BUDGET = 8000  # milli-CPUs all Guaranteed pods may hold at once (of 15 after the reserved one)
TOTAL_BUDGET = 10000  # milli-CPUs all pods may request at once
ADMITTED = 16000  # milli-CPUs kubelet admits on the soak's node (its 16 CPUs, none reserved to the system)
LIVE = (2, 5)  # pods alive at once: at least, at most
CLAIMING = "dc"  # the kind whose pods claim their CPUs
CLAIM_CPUS = (1, 2)  # how many a claim asks for
UNPLACED = 90.0  # seconds a pod of a claim may wait for kube-scheduler before the churn deletes it
DRIVER = "cpu.cri-resource-manager.intel.com"  # the DRA driver cri-resmgr registers as (and its DeviceClass)
TEMPLATES = ("resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates")


def template_name(cpus: int) -> str:
    return f"soak-cpus-{cpus}"


def claim_templates() -> list[dict[str, Any]]:
    """A ResourceClaimTemplate for each size of claim: that many CPUs of one NUMA node's device."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": template_name(n)},
             "spec": {"spec": {"devices": {"requests": [{"name": "cpus", "exactly": {
                 "deviceClassName": DRIVER,
                 "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].kind == "numa"'}}],
                 "capacity": {"requests": {"cpu": str(n)}}}}]}}}} for n in CLAIM_CPUS]


def _quantities(part: Part) -> dict[str, Any]:
    res: dict[str, Any] = {}
    req = {k: v for k, v in (("cpu", f"{part.cpu}m" if part.cpu else ""),
                             ("memory", f"{part.memory}Mi" if part.memory else "")) if v}
    lim = {k: v for k, v in (("cpu", f"{part.cpu_limit}m" if part.cpu_limit else ""),
                             ("memory", f"{part.memory_limit}Mi" if part.memory_limit else "")) if v}
    if req:
        res["requests"] = req
    if lim:
        res["limits"] = lim
    return res


PODPOOL_ANNOTATION = "pool.podpools.cri-resource-manager.intel.com"
IN_PODPOOL = ("bn", "be", "mb")  # kinds of which half ask for a pod pool (podpools runs them there)


LOOP = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]


def manifest(name: str, node: str, parts: tuple[Part, ...], annotations: dict[str, str] | None = None,
             init: tuple[Part, bool] | None = None, claim: int = 0) -> dict[str, Any]:
    """claim: the first container's CPUs come from a claim of that many (the pod goes through
    kube-scheduler, which allocates it, to the node)."""
    containers = [{"name": f"c{i}", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": LOOP,
                   "resources": _quantities(p),
                   "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                                    {"resourceName": "memory", "restartPolicy": "NotRequired"}]}
                  for i, p in enumerate(parts)]
    spec: dict[str, Any] = {"nodeName": node, "containers": containers, "terminationGracePeriodSeconds": 5,
                            "automountServiceAccountToken": False, "enableServiceLinks": False}
    if claim:
        del spec["nodeName"]
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        spec["resourceClaims"] = [{"name": "cpus", "resourceClaimTemplateName": template_name(claim)}]
        containers[0]["resources"]["claims"] = [{"name": "cpus"}]
    if init is not None:
        part, sidecar = init
        first = {"name": "init", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                 "command": LOOP if sidecar else ["sh", "-c", "sleep 2"], "resources": _quantities(part)}
        spec["initContainers"] = [{**first, "restartPolicy": "Always"} if sidecar else first]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"soak": "yes"}, "annotations": annotations or {}}, "spec": spec}


def running(pod: Any, containers: int) -> bool:
    """Every container of the pod runs and is ready."""
    statuses = pod.status.container_statuses or []
    return pod.status.phase == "Running" and len(statuses) == containers and all(
        st.ready and st.state and st.state.running for st in statuses)


def refusal(pod: Any) -> str:
    """Why the runtime refused to make a container of the pod, as kubelet reports it ("": none)."""
    for st in pod.status.container_statuses or []:
        waiting = st.state.waiting if st.state else None
        if waiting is not None and waiting.reason == "CreateContainerError":
            return waiting.message or waiting.reason
    return ""


@dataclass
class PodRecord:
    name: str
    kind: str
    parts: tuple[Part, ...]
    made: float  # monotonic
    uid: str = ""
    running: float = 0.0  # when first seen running (monotonic)
    seen: float = 0.0  # when last seen running (monotonic)
    deleted: float = 0.0
    gone: float = 0.0
    resized: bool = False
    claim: int = 0  # CPUs its claim gives it

    @property
    def guaranteed(self) -> bool:
        return all(p.cpu and p.cpu == p.cpu_limit and p.memory == p.memory_limit for p in self.parts)

    def milli(self) -> int:
        return sum(p.cpu for p in self.parts)

    def exclusive(self) -> int:
        """Milli-CPUs of its own: a Guaranteed pod's, or its claim's."""
        return self.milli() if self.guaranteed else self.claim * MILLI


@dataclass
class Load:
    """Runs in a thread of its own until stopped; paused while the API server is away on purpose."""

    core: CoreV1Api
    node: str
    rng: random.Random
    pace: tuple[float, float] = (15.0, 40.0)  # seconds between two actions: what an emulated node keeps up with
    pods: dict[str, PodRecord] = field(default_factory=dict)
    made: int = 0
    deleted: int = 0
    resized: int = 0
    errors: list[str] = field(default_factory=list)
    paused: threading.Event = field(default_factory=threading.Event)
    spared: set[str] = field(default_factory=set)  # pods the churn neither deletes nor resizes for now
    claiming: threading.Event = field(default_factory=threading.Event)  # set: the policy in force offers devices
    claimed: dict[str, int] = field(default_factory=dict)  # pod UID -> CPUs its claim gives it (the judge's)
    unclaimed: set[str] = field(default_factory=set)  # ... of those, the pods deleted (the judge's)
    unplaced: int = 0  # pods of a claim kube-scheduler found no room for within UNPLACED s, deleted
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def live(self) -> list[PodRecord]:
        with self._lock:
            return [p for p in self.pods.values() if not p.deleted]

    def movable(self) -> list[PodRecord]:
        """The live pods the churn may delete or resize."""
        return [p for p in self.live() if p.name not in self.spared]

    def run(self) -> None:
        while not self._stop.is_set():
            if not self.paused.is_set():
                try:
                    self.step()
                except ApiException as err:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {err.status} {err.reason}")
                except Exception as err:  # the API server away (refused, reset): try again later
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {type(err).__name__}: {str(err)[:200]}")
            self._stop.wait(self.rng.uniform(*self.pace))

    def stop(self) -> None:
        self._stop.set()

    def look(self) -> dict[str, Any]:
        """The soak's pods as the API server has them, by name; marks those seen running."""
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(
            NAMESPACE, label_selector="soak=yes", _request_timeout=20).items}
        now = time.monotonic()
        waited = []
        with self._lock:
            for name, rec in self.pods.items():
                pod = pods.get(name)
                if pod is None:
                    if rec.deleted and not rec.gone:
                        rec.gone = now
                elif not rec.running and running(pod, len(rec.parts)):
                    rec.running = now
                elif rec.claim and not rec.deleted and not pod.spec.node_name and now - rec.made > UNPLACED:
                    waited.append(rec)
        for rec in waited:  # no device with room (the node's CPUs taken in pieces): a user gives up
            self.delete(rec)
            self.unplaced += 1
        return pods

    def step(self) -> None:
        self.look()
        live = self.live()
        r = self.rng.random()
        if len(live) < LIVE[0] or (len(live) < LIVE[1] and r < 0.5):
            self.make()
        elif r < (0.65 if self.resized else 0.85):  # a short run resizes at least once too
            self.resize()
        elif movable := self.movable():
            self.delete(self.rng.choice(movable))

    def _budget(self, extra: PodRecord | None = None, more: int = 0) -> tuple[int, int]:
        """Milli-CPUs of Guaranteed pods and of all, as kubelet admits: pods being deleted count until gone."""
        with self._lock:
            live = [p for p in self.pods.values() if not p.gone] + ([extra] if extra else [])
        exclusive = sum(p.exclusive() for p in live) + more
        return exclusive, sum(p.milli() for p in live) + more

    def guaranteed(self) -> tuple[int, int]:
        """Guaranteed pods alive, and of them those seen running."""
        live = [p for p in self.live() if p.guaranteed]
        return len(live), sum(1 for p in live if p.running)

    def make(self, kind: str = "", budgets: tuple[int, int] = (EXCLUSIVE_BUDGET, TOTAL_BUDGET)) -> PodRecord | None:
        """A pod of the kind given, or of one drawn by how often each comes; none beyond the budgets
        (milli-CPUs of Guaranteed pods, of all pods): the pod made, or None."""
        if not kind and self.claiming.is_set() and not any(p.claim for p in self.live()):
            kind = CLAIMING  # while the policy offers devices, a pod of a claim at least
        if not kind:
            kinds = [k for k in KINDS if k != CLAIMING or self.claiming.is_set()]
            kind = self.rng.choices(kinds, weights=[KINDS[k][1] for k in kinds])[0]
        parts = KINDS[kind][0]
        rec = PodRecord(f"{kind}-{self.made}", kind, parts, time.monotonic(),
                        claim=self.rng.choice(CLAIM_CPUS) if kind == CLAIMING else 0)
        exclusive, total = self._budget(rec)
        if exclusive > budgets[0] or total > budgets[1]:
            return None
        pooled = kind in IN_PODPOOL and self.rng.random() < 0.5
        annotations = {PODPOOL_ANNOTATION: PODPOOL} if pooled else {}
        pod = self.core.create_namespaced_pod(NAMESPACE, manifest(rec.name, self.node, parts, annotations,
                                                                  INIT.get(kind), rec.claim))
        rec.uid = pod.metadata.uid
        if rec.claim:
            self.claimed[rec.uid] = rec.claim
        with self._lock:
            self.pods[rec.name] = rec
        self.made += 1
        return rec

    def delete(self, rec: PodRecord) -> None:
        try:
            self.core.delete_namespaced_pod(rec.name, NAMESPACE)
        except ApiException as err:
            if err.status != 404:
                raise
        rec.deleted = time.monotonic()
        self.deleted += 1
        if rec.claim:
            self.unclaimed.add(rec.uid)

    def drop_claims(self) -> list[PodRecord]:
        """Every live pod of a claim deleted (a policy that offers no device could not hold them)."""
        dropped = [p for p in self.live() if p.claim]
        for rec in dropped:
            self.delete(rec)
        return dropped

    def resize(self) -> None:
        """A Guaranteed 1-CPU pod to 2 CPUs, a 2-CPU one down to 1 (CPUs given back while it runs), or a
        limited Burstable one's request doubled."""
        candidates = [p for p in self.movable() if p.kind in ("g1", "g2", "bl") and not p.resized and p.running]
        if not candidates:
            return
        rec = self.rng.choice(candidates)
        old = rec.parts[0]
        if rec.kind == "g1":
            new = Part(2000, old.memory, 2000, old.memory_limit)
            exclusive, total = self._budget(more=1000)
            if exclusive > EXCLUSIVE_BUDGET or total > TOTAL_BUDGET:
                return
        elif rec.kind == "g2":
            new = Part(1000, old.memory, 1000, old.memory_limit)
        else:
            new = Part(old.cpu * 2, old.memory, old.cpu_limit, old.memory_limit)
        body = {"spec": {"containers": [{"name": "c0", "resources": _quantities(new)}]}}
        self.core.patch_namespaced_pod_resize(rec.name, NAMESPACE, body)
        rec.parts, rec.resized = (new,), True
        self.resized += 1
