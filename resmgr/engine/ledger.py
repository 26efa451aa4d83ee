"""The state ledger: pods, containers and what the policy granted them, kept consistent.

Beside them it keeps the containers in a state of their own: those the policy holds
nothing for (unallocated), those running as plain shared ones because what they ask
did not fit (degraded), creates whose outcome is not known yet (unsettled) and updates
for creates still in flight (deferred). Forgetting a container drops it from all of them.
It also remembers the CPUs each pod's container ran on by pod UID and container name
(previous), so a restarted container, or every container after a node reboot, is offered
them again; the memory goes with the pod's last sandbox when kubelet removes it. A pod whose
sandboxes vanished from the runtime instead (the node rebooted: kubelet makes it anew) is
remembered for VANISHED_KEEP seconds (vanished). The CPUs of their own that containers which
ended with their pod held (a reboot) are kept for them (awaited) while the pod is known, until
kubelet makes them again: other containers get them only where nothing else will do (View.held),
as kubelet's CPU manager keeps a pod's CPUs for it. The DRA claims kubelet prepared are the
policy's to record (Policy.prepared_claims); a policy switch prepares them again under the new
policy.

Whatever resources a decision gives a container, the fields runtime hook plugins set for
it (Container.adjusted) are laid over them, so a later move keeps a plugin's changes.

One synchronous piece of bookkeeping used by the engine, `cri-resmgr simulate` and the
tests: placing a container (with rollback when the policy refuses), applying a decision,
releasing and forgetting, the order in which containers are (re)allocated, and the
shadow copy on which a policy switch is decided. It does no I/O and never awaits, so the
engine calls it under its lock and everything here is atomic.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

from resmgr.engine import life
from resmgr.model import Claim, Container, ContainerState, Decision, Pod, QOSClass, Resources, View
from resmgr.policies.base import Policy, PolicyError
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")

# How long the CPUs of a pod whose sandboxes vanished are kept for it: kubelet makes its pods anew
# minutes after a reboot (an emulated node took 8), and a pod deleted meanwhile never comes back.
VANISHED_KEEP = 900.0
# How long after a container was released the runtime may still list it running before that
# counts: containerd answers a StopContainer before it has handled the exit, and on a starved node
# its record says running for seconds after.
RELEASE_LAG = 60.0
_QOS_ORDER = {QOSClass.GUARANTEED: 0, QOSClass.BURSTABLE: 1, QOSClass.BEST_EFFORT: 2}


class Ledger:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.pods: dict[str, Pod] = {}
        self.containers: dict[str, Container] = {}  # by Container.key
        self.seq = 0
        # Known containers the policy holds nothing for (it changed, its data was lost, no room).
        self.unallocated: set[str] = set()
        # Containers running as plain shared ones because what they ask for did not fit.
        self.degraded: set[str] = set()
        # Creates whose runtime call failed or was cancelled (made or not, nobody knows yet), with
        # when that was known (time.monotonic()).
        self.unsettled: dict[str, float] = {}
        # Containers released, with when (time.monotonic()): see RELEASE_LAG.
        self.released_at: dict[str, float] = {}
        # Updates for containers whose create was still in flight, applied once it lands.
        self.deferred: dict[str, Resources] = {}
        # The CPUs a container ended on, by "<pod UID>/<container name>".
        self.previous: dict[str, str] = {}
        # Pod UIDs whose sandboxes vanished from the runtime, and when (wall clock: it outlives reboots).
        self.vanished: dict[str, float] = {}
        # The exclusive CPUs of containers that ended with their pod, by identity, until made again.
        self.awaited: dict[str, str] = {}

    def held(self, but: str = "") -> CPUSet:
        """The CPUs kept for containers kubelet is to make again (but the one of identity but), while
        their pod is known (a sandbox of it, or vanished lately)."""
        out = CPUSet()
        if not self.awaited:
            return out
        uids = {p.uid for p in self.pods.values()} | set(self.vanished)
        for identity, cpus in self.awaited.items():
            if identity != but and identity.partition("/")[0] in uids:
                out |= CPUSet.parse_or_empty(cpus)
        return out

    def view(self, but: str = "") -> View:
        containers = self.containers
        if self.deferred:  # creates in flight a later decision moved: the policy sees where they go
            containers = dict(containers)
            for key, res in self.deferred.items():
                if (c := containers.get(key)) is not None:
                    containers[key] = dataclasses.replace(c, resources=res.overlaid(c.adjusted))
        return View(self.pods, containers, self.held(but))

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def load(self, pods: Iterable[Pod], containers: Iterable[Container], unallocated: Iterable[str] = (),
             degraded: Iterable[str] = (), previous: dict[str, str] | None = None,
             vanished: dict[str, float] | None = None, now: float | None = None,
             awaited: dict[str, str] | None = None) -> None:
        self.pods = {p.id: p for p in pods}
        now = time.time() if now is None else now
        self.vanished = {u: t for u, t in (vanished or {}).items() if now - t < VANISHED_KEEP}
        uids = {p.uid for p in self.pods.values()} | set(self.vanished)
        self.previous = {k: v for k, v in (previous or {}).items() if k.partition("/")[0] in uids}
        self.awaited = {k: v for k, v in (awaited or {}).items() if k.partition("/")[0] in uids}
        self.containers = {c.key: c for c in containers}
        self.seq = max([p.seq for p in self.pods.values()] + [c.seq for c in self.containers.values()] + [0])
        self.unallocated = set(unallocated) & set(self.containers)
        self.degraded = set(degraded) & set(self.containers)

    def unallocate_all(self) -> None:
        """The policy holds nothing for anyone (it changed, or its data was lost)."""
        self.degraded.clear()
        self.unallocated = {k for k, c in self.containers.items() if c.state != ContainerState.EXITED}

    def pins(self, c: Container) -> bool:
        """Whether the container's CPUs and memory nodes are the policy's."""
        return self.policy.pins and c.key not in self.unallocated

    def waiting(self) -> list[Container]:
        """Containers the policy holds nothing for, and those that did not fit, in allocation order."""
        return allocation_order(self.pods, [self.containers[k] for k in self.unallocated | self.degraded
                                            if k in self.containers])

    # -- pods --------------------------------------------------------------------------
    def add_pod(self, pod: Pod) -> Pod:
        """Record pod (a newer sequence number than anything before); returns it."""
        pod.seq = self.next_seq()
        self.pods[pod.id] = pod
        self.vanished.pop(pod.uid, None)
        return pod

    def drop_pod(self, pod: Pod, vanished: bool = False, now: float | None = None) -> Decision:
        """Forget a pod and every container in it. vanished: its sandbox is gone from the runtime
        without kubelet removing it (a reboot): where its containers ran is kept a while."""
        decision = Decision()
        for c in [c for c in self.containers.values() if c.pod_id == pod.id]:
            if vanished:
                self.await_return(c)
            decision.updates.update(self.forget(c).updates)
        self.pods.pop(pod.id, None)
        now = time.time() if now is None else now
        if vanished and pod.uid and not any(p.uid == pod.uid for p in self.pods.values()):
            self.vanished[pod.uid] = now
        gone = {u for u, t in self.vanished.items() if now - t >= VANISHED_KEEP}
        if not vanished and not any(p.uid == pod.uid for p in self.pods.values()):
            gone.add(pod.uid)
        if gone:
            for uid in gone:
                self.vanished.pop(uid, None)
            self.previous = {k: v for k, v in self.previous.items() if k.partition("/")[0] not in gone}
            self.awaited = {k: v for k, v in self.awaited.items() if k.partition("/")[0] not in gone}
        return decision

    def await_return(self, c: Container) -> None:
        """Keep the CPUs of its own a container runs on for when kubelet makes it again: its pod's
        sandbox is gone, or not ready with the container ended (a node reboot: containerd keeps
        the sandbox; a sandbox that died)."""
        identity = self._identity(c)
        grant = self.policy.describe_grant(c.key) if identity and self.pins(c) and c.key not in self.degraded \
            else None
        if grant and grant.get("kind") in ("exclusive", "mixed") and c.state != ContainerState.EXITED:
            self.awaited[identity] = str(grant.get("exclusive", ""))

    def _identity(self, c: Container) -> str:
        """The container's name within its pod's identity, which outlives sandboxes ("": none)."""
        pod = self.pods.get(c.pod_id)
        return f"{pod.uid}/{c.name}" if pod is not None and pod.uid else ""

    # -- containers ----------------------------------------------------------------------
    def place(self, c: Container, pod: Pod) -> Decision:
        """Add c and let the policy allocate it.

        The decision is applied to c; its updates (other containers) are the caller's to
        record. If the policy refuses, the ledger is as it was and the error propagates.
        """
        c.seq = self.next_seq()
        self.containers[c.key] = c
        identity = self._offer_previous(c)
        try:
            decision = self.policy.allocate(c, pod, self.view(identity))
        except BaseException:
            del self.containers[c.key]
            raise
        self.awaited.pop(identity, None)  # made again: whether it got them or not, they are kept no longer
        self.apply(c, decision)
        return decision

    def place_waiting(self, c: Container, pod: Pod) -> Decision:
        """Let the policy allocate a known container it holds nothing for (adopted: it stays where it
        runs where that will do, else it is offered the CPUs its pod's container of that name ran on,
        as a container kubelet made again after a reboot before the plugin was back), or one that did
        not fit (allocated afresh). PolicyError: nothing changed. The decision is the caller's to apply."""
        identity = self._offer_previous(c)
        degraded = c.key in self.degraded
        decision = (self.policy.allocate if degraded else self.policy.adopt)(c, pod, self.view(identity))
        self.awaited.pop(identity, None)  # its own CPUs were offered to it: kept no longer
        self.degraded.discard(c.key)
        self.unallocated.discard(c.key)
        return decision

    def place_plainly(self, c: Container, pod: Pod, err: PolicyError) -> Decision | None:
        """A container found running that the policy refuses (err): without its annotations, else
        as a plain shared container (never left on CPUs that are someone else's); None: neither."""
        try:
            decision = self.policy.adopt(dataclasses.replace(c, annotations={}),
                                         dataclasses.replace(pod, annotations={}), self.view())
            log.warning("container %s (%s/%s/%s): %s; allocated ignoring its annotations", c.id, pod.namespace,
                        pod.name, c.name, err)
            return decision
        except PolicyError:
            pass
        try:
            decision = self.plain(c, pod)
        except PolicyError as err2:
            log.error("container %s (%s/%s/%s) cannot be allocated (%s; %s); it runs as it is until it can",
                      c.id, pod.namespace, pod.name, c.name, err, err2)
            return None
        log.error("container %s (%s/%s/%s): %s; it runs as a shared container until there is room", c.id,
                  pod.namespace, pod.name, c.name, err)
        self.degraded.add(c.key)
        return decision

    def _offer_previous(self, c: Container) -> str:
        """c's identity; the CPUs its pod's container of that name ran on are offered to it (previous)."""
        identity = self._identity(c)
        c.previous = self.previous.get(identity, "") if self.policy.pins else ""
        return identity

    @staticmethod
    def apply(c: Container, decision: Decision) -> None:
        """c's own part of a decision: its resources, and the classes the decision names."""
        if decision.resources is not None:
            c.resources = decision.resources.overlaid(c.adjusted)
        named = {k: v for k, v in decision.classes.items() if v}
        if named:
            c.classes = {**c.classes, **named}

    def record(self, updates: dict[str, Resources]) -> None:
        """Take updates as the containers' resources, pending until the runtime has them.

        Updates for containers whose create has not returned yet (no runtime ID) cannot be pushed
        until it has: they are deferred (rename and take_over hand them back).
        """
        for key, res in updates.items():
            c = self.containers.get(key)
            if c is None:
                continue
            if not c.id:
                self.deferred[key] = res
            else:
                c.resources = res.overlaid(c.adjusted)
                c.pending = c.state != ContainerState.EXITED

    def plain(self, c: Container, pod: Pod) -> Decision:
        """The policy's decision for c placed as a plain best-effort container (PolicyError: no room):
        only where it runs is decided, never its limits. Its own resources are the caller's to apply."""
        plain = dataclasses.replace(c, annotations={}, requested=Resources())
        decision = self.policy.allocate(plain, dataclasses.replace(pod, annotations={}, qos_class=QOSClass.BEST_EFFORT),
                                        self.view())
        if decision.resources is not None:
            res = c.requested.with_cpus(decision.resources.cpuset_cpus)
            res.cpuset_mems = decision.resources.cpuset_mems
            decision.resources = res
        return decision

    def demote(self, c: Container, pod: Pod) -> Decision:
        """c gives back what it holds and stays, placed as a plain shared container (an older attempt
        that will never be started). Its new resources are among the returned updates.

        PolicyError: it holds nothing now and runs where it did.
        """
        decision = self.policy.release(c, self.view())
        placed = self.plain(c, pod)
        decision.updates.update(placed.updates)
        if placed.resources is not None:
            decision.updates[c.key] = placed.resources
        return decision

    def enter(self, c: Container) -> None:
        """Record a container the policy has not allocated yet (found running, or made unplanned)."""
        c.seq = self.next_seq()
        self.containers[c.key] = c

    def take_over(self, holder: Container, c: Container) -> Resources | None:
        """c replaces holder, which is gone, and takes over what the policy granted it (its resources
        stay what the runtime made it with: the caller pushes the grant's if they differ). Returns
        the update deferred for holder, if any."""
        late = self.deferred.pop(holder.key, None)
        self.containers.pop(holder.key, None)
        c.classes = dict(holder.classes)
        self.unsettled.pop(holder.key, None)
        for keys in (self.unallocated, self.degraded):
            if holder.key in keys:
                keys.discard(holder.key)
                keys.add(c.key)
        self.enter(c)
        self.policy.rename(holder.key, c.key)
        return late

    # -- the container's life (life.py): its state changes only here -------------------
    def made(self, c: Container, container_id: str, state: ContainerState = ContainerState.CREATED
             ) -> Resources | None:
        """The runtime made c (its create answered, or a listing found it made, in `state`): known by its
        ID from now on. Returns the update deferred while it had none (a move meanwhile), if any."""
        old_key = c.key
        life.step(c, state)
        c.id = container_id
        self.containers.pop(old_key, None)
        c.seq = self.next_seq()  # known to the runtime from now on, not from when it was asked
        self.containers[c.key] = c
        self.policy.rename(old_key, c.key)
        return self.deferred.pop(old_key, None)

    def started(self, c: Container) -> None:
        """The runtime started c (one released meanwhile stays released)."""
        if c.state != ContainerState.EXITED:
            life.step(c, ContainerState.RUNNING)

    def seen(self, c: Container, listed: ContainerState) -> None:
        """A listing shows live c in `listed`: moved along, never back (a start answered since is newer)."""
        if life.forward(c.state, listed):
            life.step(c, listed)

    def revive(self, c: Container, listed: ContainerState) -> None:
        """Released c runs again, as a listing shows: it waits for a grant again."""
        life.step(c, listed)
        self.await_grant(c.key)

    def release(self, c: Container) -> Decision:
        """Give back what c holds (it exited); it stays known."""
        if c.state == ContainerState.EXITED:
            return Decision()
        identity = self._identity(c)
        if identity and c.resources.cpuset_cpus and self.pins(c) and c.key not in self.degraded:
            self.previous[identity] = c.resources.cpuset_cpus
        decision = self.policy.release(c, self.view())
        life.step(c, ContainerState.EXITED)
        c.pending = False
        # Newer than any reconciliation observation in flight, which may still list it running.
        c.seq = self.next_seq()
        self.released_at[c.key] = time.monotonic()
        return decision

    # -- the sets kept beside the containers: changed only here ---------------------------
    def await_grant(self, key: str) -> None:
        """The policy holds nothing for key yet: reconciliation allocates it (allocate_waiting)."""
        self.unallocated.add(key)

    def granted(self, key: str) -> None:
        self.unallocated.discard(key)

    def set_degraded(self, key: str, degraded: bool) -> None:
        """key runs as a plain shared container for want of room (or no longer does)."""
        if degraded:
            self.degraded.add(key)
        else:
            self.degraded.discard(key)

    def unsettle(self, key: str) -> None:
        """key's create failed without a word of whether the runtime made it: its listing tells."""
        self.unsettled[key] = time.monotonic()

    def unsettled_since(self, key: str) -> float | None:
        return self.unsettled.get(key)

    def settled(self, key: str) -> None:
        self.unsettled.pop(key, None)

    def drop_deferred(self, key: str) -> None:
        """The update deferred for a create in flight goes (the create was refused)."""
        self.deferred.pop(key, None)

    def released_lately(self, c: Container) -> bool:
        """Whether c was released less than RELEASE_LAG ago (the runtime's record may lag it)."""
        at = self.released_at.get(c.key)
        return at is not None and time.monotonic() - at < RELEASE_LAG

    def forget(self, c: Container) -> Decision:
        """Release c and drop it."""
        decision = self.release(c)
        self.containers.pop(c.key, None)
        self.unallocated.discard(c.key)
        self.degraded.discard(c.key)
        self.unsettled.pop(c.key, None)
        self.deferred.pop(c.key, None)
        self.released_at.pop(c.key, None)
        return decision

    def remove(self, c: Container) -> Decision:
        """Forget c, and its pod once it has no container left (simulate's and the tests' removal)."""
        decision = self.forget(c)
        if not any(o.pod_id == c.pod_id for o in self.containers.values()):
            self.pods.pop(c.pod_id, None)
        self.record(decision.updates)
        return decision

    # -- DRA claims -------------------------------------------------------------------------
    def prepare(self, claim: Claim) -> Decision:
        """Let the policy hold a claim's CPUs (PolicyError: it cannot, nothing changed); its updates
        are the caller's to record."""
        return self.policy.prepare_claim(claim, self.view())

    def unprepare(self, uid: str) -> Decision:
        return self.policy.unprepare_claim(uid, self.view())

    def reprepare(self, claims: Iterable[Claim]) -> None:
        """Prepare claims persisted apart from the policy's data under a policy that holds none yet
        (its data lost, or another policy's); one it cannot prepare is dropped, and its containers
        run where their policy then places them."""
        for claim in sorted(claims, key=lambda c: c.uid):
            try:
                self.policy.prepare_claim(claim, self.view())
            except PolicyError as err:
                log.error("%s cannot be prepared again under policy %s: %s", claim.who, self.policy.name, err)

    def reallocate(self, policy: Policy) -> dict[str, Resources]:
        """Allocate every live container under another policy and make it the ledger's.

        Decided on a shadow copy, so a PolicyError half-way leaves the ledger as it was.
        Returns the containers whose resources change; their classes are taken at once.
        """
        shadow = {k: dataclasses.replace(c, previous="") for k, c in self.containers.items()}
        view = View(self.pods, shadow, self.held())
        for _, claim in sorted(self.policy.prepared_claims().items()):  # one it cannot prepare refuses the switch
            policy.prepare_claim(claim, view)
        for c in allocation_order(self.pods, shadow.values()):
            decision = policy.allocate(c, self.pods[c.pod_id], view)
            self.apply(c, decision)
            for key, res in decision.updates.items():
                if key in shadow:
                    shadow[key].resources = res.overlaid(shadow[key].adjusted)
        updates = {}
        for key, c in shadow.items():
            old = self.containers[key]
            if c.state != ContainerState.EXITED and c.resources != old.resources:
                updates[key] = c.resources
            old.classes = c.classes
        self.policy = policy
        self.unallocated.clear()
        self.degraded.clear()
        return updates


def allocation_order(pods: dict[str, Pod], containers: Iterable[Container]) -> list[Container]:
    """Live containers of known pods, Guaranteed first, then by size: big exclusive grants before the rest."""
    live = [c for c in containers if c.state != ContainerState.EXITED and c.pod_id in pods]
    return sorted(live, key=lambda c: (_QOS_ORDER[pods[c.pod_id].qos_class],
                                       -c.requested.memory_limit_in_bytes, -c.requested.cpu_shares, c.key))
