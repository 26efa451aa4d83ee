"""The soak's invariants, judged from what the kernel enforces alone (the sampler's snapshots of
the containers' cgroup v2 files), never from what cri-resmgr reports.

What each policy promises (docs/policies.md), on the soak's configurations (the reserved CPUs
given as a cpuset, no kube-system pods):

- everywhere: a container's memory nodes are the NUMA nodes of its CPUs, and no container but
  a reserved one runs on the reserved CPUs (unless nothing else is left: kubelet's rule);
- topology-aware: a Guaranteed container with whole CPUs (cpu.max) runs on that many CPUs of its
  own: no other container on any of them, not for a moment; every other container runs on the
  shared CPUs of one pool (a NUMA node, a socket or the machine: its CPUs less the reserved and
  every exclusive one), and on all of them once CPUs given back have reached it;
- balloons: two containers run on the same CPUs or on none in common (balloons are disjoint; one
  set inside the other is a balloon whose containers are being moved), and a balloon holds the
  whole CPUs of its Guaranteed containers and no more than the type's MaxCPUs;
- static (kubelet's CPU manager): exclusive CPUs as topology-aware's, every other container on
  the default set (every CPU, the reserved ones included, but the exclusive ones), memory on every
  node (the policy places none, and lifts what another policy placed);
- podpools: as balloons (each pool instance and the default pool one set of CPUs, disjoint),
  but of no size to judge: a pool's pods share its CPUs whatever they ask (docs/policies.md),
  and the Guaranteed pods a switch brings into the default pool may ask for more than it has.

A snapshot that breaks a rule is a finding; a finding becomes a violation when it lasts longer
than the grace a move in flight may take (an exclusive CPU under another container, or two
balloons that overlap, count at once). A finding that clears for less than DIP seconds keeps
the time it was first seen. Every longer allowance is an excuse with a cause the judge saw and
a bound (EXCUSES, and the table in docs/benchmarks.md): CPUs a container held come back to the
shared ones only once the runtime confirms it gone, so a shared container narrower than its
pool, or a balloon part-moved, is excused for slow_grace (more than kubelet's runtime request
timeout) after a container that held some of those CPUs went away or gave them up.
While a configuration change is in flight the snapshot may follow the old configuration
or the new one; it is followed at the first snapshot that follows the new one, and in flight
until the node reports it applied and a grace more (switch_bound at most), and done at the first
snapshot after that which follows the new one. Once followed, findings are judged as ever but
for two containers sharing CPUs, which may still be the switch's moves (the layout before a
switch can suit both configurations: topology-aware's pools read as podpools' sets).
A snapshot that follows neither (containers part-moved) may show two containers sharing CPUs;
that is a violation unless they shared those CPUs before the change or share them once it is
done (a Guaranteed container and the others of the balloon it joins, one of which moved first),
which is known when the change is done. In NRI mode, findings of a container containerd made
without the plugin (its plugin killed by the soak, restarted by the soak's package install, or
not back yet after the soak restarted containerd or rebooted the node) are set apart
(Judge.set_apart). Findings about a container while containerd stalled on its update (its journal
shows the call failed on a deadline) are set apart until containerd takes an update of it
(Judge.excuse_refused).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from resmgr.topology.cpuset import CPUSet

STRICT = frozenset({"exclusive-shared", "balloon-overlap"})  # counted the moment they are seen
GLANCED = frozenset({"exclusive-shared"})  # ... judged on every read, agreed or not (Judge.glance)
SLOW = frozenset({"pool", "balloon-moving"})  # may wait for a stop the runtime confirms (a release)
DIP = 5.0  # a finding that clears for less than this (two reads and a half) keeps its first-seen time

# Every excuse the verdict knows: what opens it (an event the soak caused or saw), what it covers
# and what bounds it. docs/benchmarks.md has the same table with the tests that prove each bound.
EXCUSES = {
    "move": "any finding but exclusive-shared and balloon-overlap, from when it is first seen: grace",
    "release": "pool and balloon-moving findings about CPUs a container held, from when the snapshot "
               "shows it gone or its CPUs given up: slow_grace",
    "switch": "a configuration written by the soak, until the node reports it applied and grace more, "
              "switch_bound at most, and a snapshot follows it (once one has, only a pair sharing CPUs); "
              "a pair that shares CPUs meanwhile must have shared them before it or share them after it",
    "freeze": "a configuration change in flight while the soak froze containerd: the switch excuse's bound "
              "grows by the freeze's length and its grace runs from the thaw",
    "nri-kill": "NRI mode: a container first seen between the soak's SIGKILL of the plugin cutting a "
                "CreateContainer (ttrpc closed, EOF) and the plugin's next synchronization: grace more",
    "nri-away": "NRI mode: a container first seen between containerd's first create after the soak "
                "restarted it or rebooted the node (containerd started within 300 s of the strike) and the "
                "plugin's next synchronization: grace more",
    "nri-upgrade": "NRI mode: a container first seen between the soak's dpkg -i of the package (its "
                   "postinst restarts the plugin) and the plugin's next synchronization: grace more",
    "refused": "a finding but exclusive-shared, balloon-overlap and a switch's mix, about containers whose "
               "update containerd's journal shows failed on a deadline (containerd stalled), from that call's "
               "start less grace to containerd's next successful update of each, and grace more (300 s at most)",
    "restart": "a container restart counted before and after a fault the soak struck that cuts starts "
               "in flight (cri-resmgr killed or upgraded in relay mode, containerd or kubelet restarted, "
               "containerd frozen, the reboot): that fault's strike",
}


@dataclass(frozen=True)
class Machine:
    """The NUMA layout: each node's CPUs, each socket's nodes."""

    node_cpus: tuple[CPUSet, ...]
    socket_nodes: tuple[tuple[int, ...], ...]

    @property
    def online(self) -> CPUSet:
        return _union(self.node_cpus)

    def nodes_of(self, cpus: CPUSet) -> CPUSet:
        return CPUSet(n for n, ncpus in enumerate(self.node_cpus) if ncpus & cpus)

    def pools(self) -> list[CPUSet]:
        """topology-aware's pools, smallest first: NUMA nodes, sockets, the machine."""
        pools = list(self.node_cpus)
        if len(self.node_cpus) > 1:
            for nodes in self.socket_nodes:
                if len(nodes) > 1:
                    pools.append(_union(self.node_cpus[n] for n in nodes))
            if len(self.socket_nodes) > 1:
                pools.append(self.online)
        return pools


def _union(sets: Any) -> CPUSet:
    out = CPUSet()
    for s in sets:
        out |= s
    return out


@dataclass(frozen=True)
class Expect:
    """A configuration as the judge needs it."""

    policy: str  # "topology-aware", "balloons", "static" or "podpools"
    reserved: CPUSet
    max_balloon: int = 0  # balloons: the type's MaxCPUs (0: no bound)


@dataclass(frozen=True)
class Ctr:
    id: str
    pod: str  # the pod's slice
    qos: str  # guaranteed, burstable, besteffort
    cpus: CPUSet
    mems: CPUSet
    quota: float | None  # CPUs of cpu.max (None: no limit)
    runs: str  # started, created, pause
    commands: str = ""  # what runs there (the sampler's process names)
    claimed: int = 0  # the CPUs of the DRA claim its pod's containers run on (the soak's pods name one)

    @property
    def whole_cpus(self) -> int:
        """The CPUs of its own: its claim's, or a Guaranteed container's with a whole number of them
        (else 0)."""
        if self.claimed:
            return self.claimed
        if self.qos != "guaranteed" or self.quota is None or abs(self.quota - round(self.quota)) > 1e-6:
            return 0
        return round(self.quota)


def qos_of(pod_slice: str) -> str:
    if pod_slice.startswith("kubepods-burstable-"):
        return "burstable"
    if pod_slice.startswith("kubepods-besteffort-"):
        return "besteffort"
    return "guaranteed"


def pod_uid(pod_slice: str) -> str:
    """The pod's UID its slice is named after (kubepods-burstable-pod<UID, _ for ->.slice)."""
    return pod_slice.removesuffix(".slice").rpartition("-pod")[2].replace("_", "-")


def _ctr(cid: str, row: list[str], claimed: dict[str, int]) -> Ctr:
    pod, cpus, mems, cpu_max, _weight, runs, *commands = row
    quota_text, _, period = cpu_max.partition(" ")
    quota = None if quota_text == "max" else int(quota_text) / int(period or 100000)
    return Ctr(cid, pod, qos_of(pod), CPUSet.parse_or_empty(cpus), CPUSet.parse_or_empty(mems), quota, runs,
               "".join(commands), claimed.get(pod_uid(pod), 0))


def parse(snapshot: dict[str, list[str]], claimed: dict[str, int] | None = None) -> list[Ctr]:
    """The sampler's snapshot: started containers only (a sandbox or a container not yet started
    runs nothing of its own). claimed: pod UID -> the CPUs of the claim its containers run on."""
    return [_ctr(cid, row, claimed or {}) for cid, row in sorted(snapshot.items()) if row[5] == "started"]


def held(snapshot: dict[str, list[str]], claimed: dict[str, int] | None = None) -> CPUSet:
    """The CPUs of containers created with CPUs of their own but not started yet: exclusive
    already (the runtime made their cgroups so), though nothing runs there yet. Not those under a
    started container: an older attempt kubelet gave up on (it will never start it) waits on the
    shared CPUs, and an exclusive container's CPUs still under another are caught the moment it
    starts (exclusive-shared)."""
    running = _union(c.cpus for c in parse(snapshot, claimed))
    return _union(c.cpus for cid, row in snapshot.items()
                  if row[5] == "created" and (c := _ctr(cid, row, claimed or {})).whole_cpus
                  and not c.cpus & running)


def released(before: dict[str, CPUSet], ctrs: list[Ctr]) -> CPUSet:
    """The CPUs given up since before (each container's CPUs): of a container gone, or of an
    exclusive one resized down (a shared one narrowed is a move, not a release)."""
    now = {c.id: c.cpus for c in ctrs}
    whole = {c.id for c in ctrs if c.whole_cpus}
    return _union(cpus - now.get(cid, CPUSet()) for cid, cpus in before.items() if cid not in now or cid in whole)


def unseen_claims(snapshot: dict[str, list[str]], claimed: dict[str, int], created: CPUSet = CPUSet(),
                  unclaimed: set[str] | frozenset[str] = frozenset()) -> int:
    """The CPUs of the claims of pods the node runs nothing of yet (no container started, none
    holding its CPUs in created), but pods deleted (unclaimed) the kernel shows nothing of any more:
    cri-resmgr holds a claim's CPUs from kubelet's prepare, before the pod's sandbox is made, so the
    kernel shows how many, not which (nor, before the sandbox, whether they are held yet)."""
    claimed, unclaimed = dict(claimed), set(unclaimed)  # the load's thread adds to them meanwhile
    pods: dict[str, bool] = {uid: False for uid in claimed if uid not in unclaimed}
    for cid, row in snapshot.items():
        uid = pod_uid(row[0])
        if uid in claimed:
            c = _ctr(cid, row, claimed)
            placed = row[5] == "started" or (row[5] == "created" and bool(c.cpus) and c.cpus <= created)
            pods[uid] = pods.get(uid, False) or placed
    return sum(claimed[uid] for uid, placed in pods.items() if not placed)


def _off_by_unseen(cpus: CPUSet, expected: CPUSet, unseen: int) -> bool:
    """A shared container short of expected by no more CPUs than unseen claims hold."""
    return cpus != expected and cpus <= expected and len(expected - cpus) <= unseen


@dataclass(frozen=True)
class Finding:
    kind: str
    key: str  # the same finding in two snapshots has the same key
    text: str
    pairs: tuple[tuple[str, str], ...] = ()  # the containers (IDs) that share CPUs
    cpus: CPUSet = CPUSet()  # slow kinds: the CPUs out of place, which a release may explain


def findings(ctrs: list[Ctr], expect: Expect, machine: Machine, created: CPUSet = CPUSet(),
             unseen: int = 0) -> list[Finding]:
    """What ctrs break of expect; created: CPUs held by containers not started (held); unseen: CPUs of
    claims held where the kernel shows nothing yet (unseen_claims)."""
    out = _common(ctrs, expect, machine)
    if expect.policy == "topology-aware":
        out += _topology_aware(ctrs, expect, machine, created, unseen)
    elif expect.policy == "static":
        out += _static(ctrs, machine, created, unseen)
    elif expect.policy in ("balloons", "podpools"):
        out += _balloons(ctrs, expect)
    return out


def _short(c: Ctr) -> str:
    return f"{c.id[:12]} ({c.qos}, {c.pod[-14:-6]}{', ' + c.commands if c.commands else ''})"


def _common(ctrs: list[Ctr], expect: Expect, machine: Machine) -> list[Finding]:
    out = []
    everything_taken = _union(c.cpus for c in ctrs if c.whole_cpus) | expect.reserved >= machine.online
    for c in ctrs:
        if not c.cpus or not c.cpus <= machine.online:
            out.append(Finding("pinned", c.id, f"{_short(c)} runs on CPUs {c.cpus or 'none'}"))
            continue
        mems = machine.nodes_of(machine.online if expect.policy == "static" else c.cpus)
        if c.mems != mems:
            out.append(Finding("memory", c.id, f"{_short(c)} runs on CPUs {c.cpus} with memory nodes {c.mems}, "
                                               f"not {mems}"))
        if expect.policy == "static":  # the reserved CPUs are in the default set (kubelet's rule)
            continue
        if c.cpus & expect.reserved and not (c.cpus <= expect.reserved and everything_taken):
            out.append(Finding("reserved", c.id, f"{_short(c)} runs on reserved CPUs: {c.cpus}"))
    return out


def _exclusive(ctrs: list[Ctr]) -> list[Finding]:
    """A Guaranteed container with whole CPUs runs on that many CPUs, no other container on any."""
    out = []
    exclusive = [c for c in ctrs if c.whole_cpus]
    for c in exclusive:
        if len(c.cpus) != c.whole_cpus:
            out.append(Finding("exclusive-count", c.id, f"{_short(c)} has {c.whole_cpus} CPUs of its own but runs "
                                                        f"on {c.cpus}"))
        for o in ctrs:
            if o is not c and o.cpus & c.cpus:
                pair = "/".join(sorted((c.id, o.id)))
                out.append(Finding("exclusive-shared", pair, f"CPU {o.cpus & c.cpus} of {_short(c)} is also under "
                                                             f"{_short(o)}", ((c.id, o.id),)))
    return out


def _taken(ctrs: list[Ctr], created: CPUSet) -> CPUSet:
    return _union(c.cpus for c in ctrs if c.whole_cpus) | created


def _static(ctrs: list[Ctr], machine: Machine, created: CPUSet, unseen: int = 0) -> list[Finding]:
    out = _exclusive(ctrs)
    default = machine.online - _taken(ctrs, created)
    for c in ctrs:
        if not c.whole_cpus and c.cpus != default and not _off_by_unseen(c.cpus, default, unseen):
            out.append(Finding("pool", c.id, f"shared {_short(c)} runs on {c.cpus}; the default set is {default}",
                               cpus=(default - c.cpus) | (c.cpus - default)))
    return out


def _topology_aware(ctrs: list[Ctr], expect: Expect, machine: Machine, created: CPUSet,
                    unseen: int = 0) -> list[Finding]:
    out = _exclusive(ctrs)
    taken = _taken(ctrs, created)
    pools = machine.pools()
    for c in ctrs:
        if c.whole_cpus or c.cpus <= expect.reserved:
            continue
        pool = next((p for p in pools if c.cpus <= p), machine.online)
        shared = pool - expect.reserved - taken
        if c.cpus != shared and not _off_by_unseen(c.cpus, shared, unseen):
            out.append(Finding("pool", c.id, f"shared {_short(c)} runs on {c.cpus}; its pool {pool} has the shared "
                                             f"CPUs {shared}", cpus=(shared - c.cpus) | (c.cpus - shared)))
    return out


def _balloons(ctrs: list[Ctr], expect: Expect) -> list[Finding]:
    out = []
    balloons: dict[CPUSet, list[Ctr]] = {}
    for c in ctrs:
        if not c.cpus <= expect.reserved:
            balloons.setdefault(c.cpus, []).append(c)
    sets = sorted(balloons, key=lambda s: s.sorted())
    for i, a in enumerate(sets):
        for b in sets[i + 1:]:
            if a & b:
                x, y = balloons[a][0], balloons[b][0]
                kind = "balloon-moving" if a <= b or b <= a else "balloon-overlap"
                # Keyed by the CPU sets: members come and go while the same two balloons overlap.
                out.append(Finding(kind, f"{a}|{b}", f"{_short(x)} on {a} and {_short(y)} on {b} share CPUs {a & b}",
                                   tuple((m.id, n.id) for m in balloons[a] for n in balloons[b]), a | b))
    for cpus, members in balloons.items() if expect.policy == "balloons" else ():
        need = math.ceil(sum(c.quota or 0 for c in members if c.qos == "guaranteed") - 1e-6)
        if len(cpus) < need or (expect.max_balloon and len(cpus) > expect.max_balloon):
            out.append(Finding("balloon-size", str(cpus), f"balloon {cpus} of {len(members)} containers: its "
                                                         f"Guaranteed ones ask for {need} CPUs (at most "
                                                         f"{expect.max_balloon or 'any'})",
                               tuple((m.id, m.id) for m in members)))  # its members, for set_apart
    return out


@dataclass
class Violation:
    kind: str
    text: str
    first: float
    last: float
    key: str = ""  # the finding's
    ids: tuple[str, ...] = ()  # the containers it names


def _ids(f: Finding) -> tuple[str, ...]:
    if f.pairs:
        return tuple(sorted({cid for pair in f.pairs for cid in pair}))
    return (f.key,)


def _stamped(journal: str) -> Iterator[tuple[float, str]]:
    """The lines of a `journalctl -o short-unix` text with their time (others, "-- Boot" say, skipped)."""
    for line in journal.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            t = float(stamp)
        except ValueError:
            continue
        yield t, text


def nri_windows(journal: str, bound: float = 300.0) -> list[tuple[float, float]]:
    """When containerd made a container without the NRI plugin, from the journal of containerd and
    the plugin (`journalctl -o short-unix`): from a CreateContainer the plugin died answering (its
    connection closed under it: containerd closes the plugin and lets the create through,
    containerd issue 11217) to the plugin's next synchronization, which places what was made
    meanwhile (bound: none came). A CreateContainer the plugin was merely slow to answer (a
    deadline) opens nothing: containerd waits for the plugin then, or fails the create."""
    out: list[tuple[float, float]] = []
    opened: float | None = None
    for t, text in _stamped(journal):
        if "failed to handle CreateContainer request" in text and any(k in text for k in KILLED):
            opened = t if opened is None else opened
        elif "NRI: synchronized" in text and opened is not None:
            out.append((opened, t))
            opened = None
    if opened is not None:
        out.append((opened, opened + bound))
    return out


KILLED = (": closed", "EOF", "connection reset by peer", "broken pipe")  # ttrpc's words for a dead peer


def upgrade_windows(journal: str, upgrades: list[float], bound: float = 300.0) -> list[tuple[float, float]]:
    """When the NRI plugin was away for a package install of the soak's (guest times before each
    dpkg -i): from the install to the plugin's next synchronization, from its journal (`-o
    short-unix`; bound: none came). Containers containerd made meanwhile had no plugin to ask."""
    syncs = [t for t, text in _stamped(journal) if "NRI: synchronized" in text]
    return [(u, next((t for t in syncs if t > u), u + bound)) for u in upgrades]


_UPDATE = re.compile(r'UpdateContainerResources for \\?"([0-9a-f]{64})\\?" (with|failed|returns successfully)')
STALLED = ("deadline exceeded", "context canceled")  # containerd's words for an update it did not get to


def refused_windows(journal: str, bound: float = 300.0) -> dict[str, list[tuple[float, float]]]:
    """When containerd did not get to a container's update, by container, from containerd's journal
    (`-o short-unix`): from the start of an UpdateContainerResources of it that failed on a deadline
    (containerd itself stalled: the update still in its hands, or its task not answering) to the
    end of the next that returned successfully (bound: none did). A failure for another cause (an
    update containerd refused as invalid, say) opens nothing."""
    out: dict[str, list[tuple[float, float]]] = {}
    asked: dict[str, float] = {}  # the start of each container's latest call
    opened: dict[str, float] = {}
    for t, text in _stamped(journal):
        m = _UPDATE.search(text)
        if m is None:
            continue
        cid, what = m.groups()
        if what == "with":
            asked[cid] = t
        elif what == "failed" and any(k in text.lower() for k in STALLED):
            opened.setdefault(cid, asked.get(cid, t))
        elif what == "returns successfully" and cid in opened:
            out.setdefault(cid, []).append((opened.pop(cid), t))
    for cid, t in opened.items():
        out.setdefault(cid, []).append((t, t + bound))
    return out


def away_windows(journal: str, bound: float = 300.0) -> list[tuple[float, float, float]]:
    """When containerd made containers before the plugin was back after containerd itself started (a
    restart, a node reboot: NRI's design, docs/nri.md), from the journal of containerd and the plugin
    (`-o short-unix`): (containerd's start, the first create it answered meanwhile, the plugin's
    next synchronization; bound: none came). A start after which the plugin synchronized before
    any create opens nothing."""
    out: list[tuple[float, float, float]] = []
    started: float | None = None  # containerd started, the plugin not synchronized with it since
    opened: float | None = None
    for t, text in _stamped(journal):
        if "starting containerd" in text:
            if started is not None and opened is not None:
                out.append((started, opened, t))
            started, opened = t, None
        elif "returns container id" in text and started is not None and opened is None:
            opened = t
        elif "NRI: synchronized" in text and started is not None:
            if opened is not None:
                out.append((started, opened, t))
            started, opened = None, None
    if started is not None and opened is not None:
        out.append((started, opened, opened + bound))
    return out


@dataclass
class Judge:
    """Follows the snapshots: findings that last become violations; configuration changes are
    timed until the node follows them. Every allowance beyond grace is an excuse of EXCUSES."""

    machine: Machine
    expect: Expect
    grace: float = 30.0  # how long a finding may last while a move is in flight
    slow_grace: float = 180.0  # ... after a release, while the CPUs wait for the runtime to confirm a stop
    switch_bound: float = 120.0  # how long a configuration change may take at most before it is judged
    previous: Expect | None = None  # while a change is in flight: the configuration before it
    switch_started: float = 0.0
    switch_applied: float | None = None  # when the node reported the change in flight applied
    switch_followed: float | None = None  # when a snapshot first followed the change in flight
    switches: list[tuple[str, float]] = field(default_factory=list)  # (to what, seconds until followed)
    open: dict[str, Violation] = field(default_factory=dict)  # findings seen, by kind/key
    absent: dict[str, float] = field(default_factory=dict)  # ... of those, not in the last snapshot: since when
    violations: list[Violation] = field(default_factory=list)
    # While a change is in flight: each container's CPUs before it, and the mixes seen meanwhile
    # (judged once the change is done: Judge.feed).
    before_change: dict[str, CPUSet] = field(default_factory=dict)
    mixes: dict[str, tuple[Violation, dict[tuple[str, str], CPUSet]]] = field(default_factory=dict)
    last_cpus: dict[str, CPUSet] = field(default_factory=dict)
    released: list[tuple[float, CPUSet]] = field(default_factory=list)  # CPUs given up, and when (the release excuse)
    first_seen: dict[str, float] = field(default_factory=dict)  # when each container was first seen started
    stalls: list[tuple[float, float]] = field(default_factory=list)  # containerd frozen by the soak (the freeze excuse)
    claimed: dict[str, int] = field(default_factory=dict)  # pod UID -> CPUs of its claim (the soak's load)
    unclaimed: set[str] = field(default_factory=set)  # ... of those, pods deleted (the soak's load)
    seen: int = 0
    last_clean: float = 0.0
    last_time: float = 0.0

    def change(self, expect: Expect, t: float) -> None:
        """A new configuration was written to the cluster at t."""
        if expect == self.expect:
            return
        self._judge_mixes(None)  # a change on top of one in flight: what it left unresolved counts
        self.previous, self.expect, self.switch_started = self.expect, expect, t
        self.switch_applied = self.switch_followed = None
        self.before_change = dict(self.last_cpus)

    def applied(self, t: float) -> None:
        """The node reported the change in flight applied at t: its moves have grace more to land."""
        if self.previous is not None and self.switch_applied is None:
            self.switch_applied = t

    def stalled(self, start: float, end: float = math.inf) -> None:
        """The soak froze containerd at start, until end (not yet known: inf): no move reaches the
        kernel meanwhile."""
        self.stalls = [(a, b) for a, b in self.stalls if a != start] + [(start, end)]

    def _in_switch(self, t: float) -> bool:
        """Whether the change in flight is still excused at t: until the node reports it applied and a
        grace more, switch_bound at most; a freeze of containerd during it adds its length to the
        bound and the grace runs from the thaw."""
        during = [(max(a, self.switch_started), b) for a, b in self.stalls if b > self.switch_started and a < t]
        if t - self.switch_started >= self.switch_bound + sum(b - a for a, b in during):
            return False
        if self.switch_applied is None:
            return True
        return t - max([self.switch_applied] + [b for _, b in during]) < self.grace

    def feed(self, t: float, snapshot: dict[str, list[str]]) -> list[Finding]:
        """One snapshot at t; what it breaks (of the configuration the node is judged by now)."""
        self.seen += 1
        self.last_time = t
        ctrs = parse(snapshot, self.claimed)
        created = held(snapshot, self.claimed)
        unseen = unseen_claims(snapshot, self.claimed, created, self.unclaimed)
        if given_up := released(self.last_cpus, ctrs):
            self.released.append((t, given_up))
        self.released = [(r, cpus) for r, cpus in self.released if t - r < self.slow_grace]
        self.last_cpus = {c.id: c.cpus for c in ctrs}
        for c in ctrs:
            self.first_seen.setdefault(c.id, t)
        found = findings(ctrs, self.expect, self.machine, created, unseen)
        if self.previous is not None and t < self.switch_started:
            # Taken before the change was written (snapshots arrive seconds late): the old one's.
            found = findings(ctrs, self.previous, self.machine, created, unseen)
        elif self.previous is not None:
            in_switch = self._in_switch(t)
            if not found and self.switch_followed is None:
                self.switch_followed = t
                self.switches.append((self.expect.policy, t - self.switch_started))
            if not found and not in_switch:
                self.previous = None
                self._judge_mixes(self.last_cpus)
            elif in_switch and self.switch_followed is None:
                before = findings(ctrs, self.previous, self.machine, created, unseen)
                self._carry(t, found, before)
                if any(f.kind in STRICT for f in before):  # neither: a mix while containers move
                    mixed = [Finding(f"switch-{f.kind}", f.key, f.text, f.pairs) for f in found if f.kind in STRICT]
                    self._note_mixes(t, mixed, self.last_cpus)
                return []
            elif in_switch:
                # Followed once, yet its moves may still be landing: the layout before a switch can
                # suit both configurations (topology-aware's pools read as podpools' disjoint sets).
                # Two containers sharing CPUs are judged as the switch's mix; the rest as ever.
                mixed = [Finding(f"switch-{f.kind}", f.key, f.text, f.pairs) for f in found if f.kind in STRICT]
                self._note_mixes(t, mixed, self.last_cpus)
                found = [f for f in found if f.kind not in STRICT]
            else:
                self._judge_mixes(None)  # not done within its bound: every mix counts
        self._track(t, found)
        if not found:
            self.last_clean = t
        return found

    def glance(self, t: float, snapshot: dict[str, list[str]]) -> list[Finding]:
        """A read no second read agreed with (something moved while it was read): judged only for an
        exclusive CPU under another container (GLANCED), as a snapshot is; in a change in flight, as
        a mix. Not balloons: the members of one balloon being reshaped (in a switch, too), read
        apart, look like two balloons that overlap."""
        ctrs = parse(snapshot, self.claimed)
        for c in ctrs:
            self.first_seen.setdefault(c.id, t)
        created = held(snapshot, self.claimed)
        switching = self.previous is not None and t >= self.switch_started
        expect = self.previous if self.previous is not None and not switching else self.expect
        found = [f for f in findings(ctrs, expect, self.machine, created) if f.kind in GLANCED]
        if switching and self._in_switch(t):
            assert self.previous is not None
            before = findings(ctrs, self.previous, self.machine, created)
            if found and any(f.kind in STRICT for f in before):
                cpus = {c.id: c.cpus for c in ctrs}
                self._note_mixes(t, [Finding(f"switch-{f.kind}", f.key, f.text, f.pairs) for f in found], cpus)
            return []
        for f in found:
            self._back(self._key(f), t)
            v = self.open.get(self._key(f))
            if v is None:
                v = self.open[self._key(f)] = Violation(f.kind, f.text, t, t, f.key, _ids(f))
                self.violations.append(v)
            v.last = t
        return found

    @staticmethod
    def _key(f: Finding) -> str:
        return f"{f.kind}:{f.key}"

    def _note_mixes(self, t: float, found: list[Finding], cpus: dict[str, CPUSet]) -> None:
        for f in found:
            v, shared = self.mixes.setdefault(self._key(f), (Violation(f.kind, f.text, t, t, f.key, _ids(f)), {}))
            v.last = t
            for a, b in f.pairs:
                shared[(a, b)] = shared.get((a, b), CPUSet()) | (cpus.get(a, CPUSet()) & cpus.get(b, CPUSet()))

    def _judge_mixes(self, after: dict[str, CPUSet] | None) -> None:
        """The mixes of the change in flight: a violation where two containers shared CPUs they shared
        neither before it nor after it (after None: the change did not end, every mix counts)."""
        empty = CPUSet()
        for v, shared in self.mixes.values():
            if after is None or any(
                    not cpus <= (self.before_change.get(a, empty) & self.before_change.get(b, empty))
                    | (after.get(a, empty) & after.get(b, empty)) for (a, b), cpus in shared.items()):
                self.violations.append(v)
        self.mixes = {}

    def finish(self) -> None:
        """The run ended: the mixes of a change still in flight count, and so does every finding
        still open that has lasted its grace, whatever excused it so far."""
        self._judge_mixes(None)
        self.violations += [v for v in self.lingering() if v not in self.violations]

    def _forget(self, t: float, present: set[str]) -> None:
        """Open findings not present now are closed once absent for DIP (a shorter dip keeps them)."""
        for key in list(self.open):
            since = self.absent.get(key)
            if key in present and since is not None:
                self._back(key, t)
            elif key not in present and since is None:
                self.absent[key] = t
            elif key not in present and t - since >= DIP:
                del self.open[key], self.absent[key]

    def _back(self, key: str, t: float) -> None:
        """A finding seen again: no longer absent; after a dip of DIP or longer, a finding of its own."""
        since = self.absent.pop(key, None)
        if since is not None and t - since >= DIP:
            self.open.pop(key, None)

    def _carry(self, t: float, found: list[Finding], before: list[Finding]) -> None:
        """In a switch: findings seen under either configuration keep their first-seen time, and
        one that both configurations find (memory nodes wrong, say) is timed from now on."""
        present = {self._key(f) for f in found + before}
        self._forget(t, present)
        for key in present & self.open.keys():
            self.open[key].last = t
        old = {self._key(f) for f in before}
        for f in found:
            key = self._key(f)
            if key in old and key not in self.open and f.kind not in STRICT:
                self.open[key] = Violation(f.kind, f.text, t, t, f.key, _ids(f))

    def _released(self, f: Finding, t: float) -> bool:
        return f.kind in SLOW and any(cpus & f.cpus for r, cpus in self.released if t - r < self.slow_grace)

    def _track(self, t: float, found: list[Finding]) -> None:
        now = {self._key(f): f for f in found}
        self._forget(t, set(now))
        for key, f in now.items():
            v = self.open.get(key)
            if v is None:
                v = self.open[key] = Violation(f.kind, f.text, t, t, f.key, _ids(f))
                if f.kind in STRICT or f.kind.startswith("switch-"):
                    self.violations.append(v)
                continue
            v.last, v.text = t, f.text
            if t - v.first >= self.grace and v not in self.violations and not self._released(f, t):
                self.violations.append(v)

    def set_apart(self, windows: list[tuple[float, float]]) -> list[Violation]:
        """Take out of the violations (and return) those of the NRI window: each names a container
        first seen within a window (nri_windows) and was over by the window's end and a grace, the
        plugin's moves in flight. What lasts longer, or names only containers made outside every
        window, stays a violation."""
        def made_apart(cid: str, v: Violation) -> bool:
            return any(start <= self.first_seen.get(cid, -math.inf) <= end and v.last <= end + self.grace
                       for start, end in windows)

        def within(v: Violation) -> bool:
            if v.kind == "balloon-size":  # a balloon's size is all its members' doing
                return bool(v.ids) and all(made_apart(cid, v) for cid in v.ids)
            return any(made_apart(cid, v) for cid in v.ids)

        return self._take(within)

    def _take(self, excused: Callable[[Violation], bool]) -> list[Violation]:
        """Take the violations excused out of the violations, and return them."""
        apart: list[Violation] = []
        kept: list[Violation] = []
        for v in self.violations:
            (apart if excused(v) else kept).append(v)
        self.violations = kept
        return apart

    def excuse_refused(self, refused: dict[str, list[tuple[float, float]]]) -> list[Violation]:
        """Take out of the violations (and return) the findings about containers whose update
        containerd did not get to meanwhile (refused_windows): a container left where it was, while
        cri-resmgr's update of it waited on containerd. Each of its containers must be in such a
        window from the finding's first sight (less grace: the update may have been sent just
        before) to its end (a grace more). Never two containers sharing CPUs (STRICT), nor a
        switch's mixes."""
        def covered(cid: str, v: Violation) -> bool:
            return any(a - self.grace <= v.first and v.last <= b + self.grace for a, b in refused.get(cid, []))

        return self._take(lambda v: v.kind not in STRICT and not v.kind.startswith("switch-") and bool(v.ids)
                          and all(covered(cid, v) for cid in v.ids))

    def clean(self) -> bool:
        """The last snapshot broke nothing."""
        return self.last_clean == self.last_time and self.seen > 0

    def stuck(self) -> list[Violation]:
        """Findings of the last snapshot that have outlasted their grace (moves in flight aside)."""
        return [v for key, v in self.open.items()
                if v.kind not in STRICT and v in self.violations and key not in self.absent]

    def lingering(self) -> list[Violation]:
        """Findings of the last snapshot that have lasted the grace, excused or not (at the end of a
        run no excuse is left open)."""
        return [v for key, v in self.open.items() if key not in self.absent and v.last - v.first >= self.grace]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.violations:
            out[v.kind] = out.get(v.kind, 0) + 1
        return out
