"""Soak: pods churned through the relay by parallel kubelet-like workers while cri-resmgr is
SIGKILLed at random moments and containerd now and then.

CPU 0 is reserved and reconciliation runs at its default interval, as on a node. Each round
kills one to three times at random moments while the workers churn, most of the time aimed
inside a lifecycle call: cri-resmgr alone, or containerd alone (cri-resmgr sees its calls
fail), or both (cri-resmgr may come back before containerd does), or cri-resmgr while
containerd is frozen for a few seconds; some kills land after containerd made a container and
before its create answered. The workers do what clients do: retry a call that failed; take a
name the runtime holds for an earlier create of theirs by starting or removing the container
the error names, or (as kubelet does) by making the next attempt; give up on stops of
containers that ignore SIGTERM, as a kubelet deadline would. Then the workers are paused and
the node is checked, reading only the runtime and the cgroups:

- no CPU held exclusively is used by any other running container (also watched all along, not
  only then);
- every other live container runs on exactly the shared CPUs (see shared_cpus), so nothing the
  runtime removed is still held and every cpuset is the policy's;
- cri-resmgr never exits by itself.

A worker that cannot finish its step within 120 s is reported as a stall (with the call it is in
and whether the relay answers then), not counted as a violation: the node is checked all the same.

The relay gets CONVERGE seconds after each recovery to repair what it must. `--soak-seconds N`
sets how long each policy is churned (default 90); the figures are printed at the end.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from harness.containerd import PrivateContainerd
from resmgr.generated.cri import api_pb2 as cri
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import (
    ONLINE,
    Cri,
    RelayProcess,
    container_config,
    live_cpusets,
    pod_config,
    policy_relay,
    watch_exclusive,
)

pytestmark = [
    pytest.mark.soak, pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs"),
]

NAME_HELD = re.compile(r'is reserved for "([0-9a-f]+)"')
# containerd can refuse a RemoveContainer right after a StopContainer that a cut-off stop raced with,
# while its task's exit is still being handled; kubelet's container GC removes it on a later round.
STILL_RUNNING = "cannot delete running task"
RETRIED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
           grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED}
CONVERGE = 15.0
RESERVED_CPUS = CPUSet([0])
WORKERS = 3
LIVE = (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING)

# kind: (QoS, milli-CPU, weight); "exclusive" asks for one whole CPU of its own.
KINDS = {"exclusive": ("guaranteed", 1000, 5), "fraction": ("guaranteed", 500, 2),
         "burstable": ("burstable", 300, 2), "besteffort": ("besteffort", 0, 2)}


def resources(kind: str) -> cri.LinuxContainerResources:
    qos, milli, _ = KINDS[kind]
    shares = max(2, milli * 1024 // 1000)
    if qos == "guaranteed":
        return cri.LinuxContainerResources(cpu_shares=shares, cpu_quota=milli * 100, cpu_period=100000,
                                           memory_limit_in_bytes=64 << 20)
    return cri.LinuxContainerResources(cpu_shares=shares)


@dataclass
class Stats:
    iterations: int = 0
    calls: int = 0
    retries: int = 0
    refused: int = 0  # creates refused for lack of CPUs (expected: one exclusive CPU at most)
    reserved: int = 0  # creates refused because the runtime held the name for an earlier one
    relay_kills: int = 0
    containerd_kills: int = 0
    freezes: int = 0
    cut_stops: int = 0  # stops whose caller gave up while the container still ran
    checks: int = 0
    degraded: int = 0
    stalls: list[str] = field(default_factory=list)
    converge: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


    longest: tuple[float, str] = (0.0, "")  # the longest a call took to succeed, and its last failure

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def retried_for(self, seconds: float, failure: str) -> None:
        with self.lock:
            if seconds > self.longest[0]:
                self.longest = (seconds, failure)


class Kubelet:
    """One worker: runs and removes pods like kubelet, retrying calls that failed on the way."""

    def __init__(self, socket: str, workdir: Path, stats: Stats, rng: random.Random) -> None:
        self.cri = Cri(socket)
        self.workdir, self.stats, self.rng = workdir, stats, rng
        self.pods: list[str] = []
        self.paused = threading.Event()
        self.idle = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.in_call = ""  # the lifecycle call in flight, for the killer to aim at
        self.creating = ""  # the label of the container being created
        self.last_error = ""  # the last call that failed, for a stall's report

    # -- calls with retries ---------------------------------------------------------------
    def _call(self, method: str, req, settle=None, done_codes=(), timeout: float = 30, on_reserved=None):
        """Call until it succeeds; after a failure, settle() may find it was done after all.

        A name the runtime holds for an earlier create (its caller was cut off) is handed to
        on_reserved(holder ID), which may return the call's result; else the call is made again.
        """
        delay, first, self.last_error = 0.1, time.monotonic(), ""
        while True:
            self.stats.add("calls")
            self.in_call = method
            kills = self.stats.containerd_kills
            try:
                resp = getattr(self.cri.rt, method)(req, timeout=timeout)
                self.stats.retried_for(time.monotonic() - first, self.last_error)
                return resp
            except grpc.RpcError as err:
                self.last_error = f"{method}: {err.code().name}: {err.details()}"
                if err.code() in done_codes:
                    return None
                holder = NAME_HELD.search(err.details() or "") if err.code() == grpc.StatusCode.FAILED_PRECONDITION \
                    else None
                running = method == "RemoveContainer" and err.code() == grpc.StatusCode.FAILED_PRECONDITION \
                    and STILL_RUNNING in (err.details() or "")
                if err.code() not in RETRIED and holder is None and not running:
                    raise
            finally:
                self.in_call = ""
            self.stats.add("retries")
            if method == "CreateContainer" and self.stats.containerd_kills != kills:
                # containerd died with the create in it: the next attempt, as kubelet would once it
                # lists the pod again (the same name again risks what run_pod says of sandboxes).
                req.config.metadata.attempt += 1
            if holder is not None and on_reserved is not None:
                self.stats.add("reserved")
                found = on_reserved(holder.group(1))
                if found is not None:
                    return found
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            if settle is not None:
                try:
                    found = settle()
                except grpc.RpcError:
                    found = None
                if found is not None:
                    return found

    def run_pod(self, cfg: cri.PodSandboxConfig) -> str:
        req = cri.RunPodSandboxRequest(config=cfg)

        def settle():
            items = self.cri.rt.ListPodSandbox(cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(
                label_selector={"soak-pod": cfg.labels["soak-pod"]})), timeout=10).items
            ready = [p for p in items if p.state == cri.SANDBOX_READY]
            for p in items:
                if p.state != cri.SANDBOX_READY:  # half made: kubelet removes it and tries again
                    self.remove_pod(p.id)
            if ready:
                return cri.RunPodSandboxResponse(pod_sandbox_id=ready[0].id)
            # kubelet's next attempt. (The same name again after containerd was killed in the call
            # left containerd 2.2.9 two sandboxes of one name, and then it refused to start: "failed
            # to recover state: failed to reserve sandbox name".)
            req.config.metadata.attempt += 1
            return None

        return self._call("RunPodSandbox", req, settle).pod_sandbox_id

    def create(self, pod_id: str, cfg: cri.PodSandboxConfig, kind: str) -> str:
        stubborn = self.rng.random() < 0.5  # ignores SIGTERM: a stop must wait, then kill
        command = ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"] if stubborn else None
        config = container_config(f"c{self.rng.randrange(1000)}", command=command, resources=resources(kind))
        label = uuid.uuid4().hex
        config.labels.update({"soak-ctr": label, "soak-kind": kind})

        def settle():
            found = self.cri.rt.ListContainers(cri.ListContainersRequest(filter=cri.ContainerFilter(
                pod_sandbox_id=pod_id, label_selector={"soak-ctr": label})), timeout=10).containers
            return cri.CreateContainerResponse(container_id=found[0].id) if found else None

        req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=cfg)

        def on_reserved(holder: str):
            """What clients do with a name the runtime holds for an earlier create of theirs."""
            how = self.rng.random()
            if how < 0.5:  # take the container the error names as the one made, and start it
                return cri.CreateContainerResponse(container_id=holder)
            if how < 0.75:  # remove it, then create again under the same name
                try:
                    self.cri.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=holder), timeout=10)
                except grpc.RpcError:
                    pass
                return None
            # kubelet: the next attempt, the earlier container left created (never started) until the
            # pod goes, as kubelet's container GC keeps the last dead one of each name
            req.config.metadata.attempt += 1
            return None

        # Mostly like kubelet, which learns of a cut-off create only from the name; else by a label.
        self.creating = label
        try:
            return self._call("CreateContainer", req, settle if self.rng.random() < 0.3 else None,
                              on_reserved=on_reserved).container_id
        finally:
            self.creating = ""

    def start(self, cid: str) -> None:
        def settle():
            st = self._call("ContainerStatus", cri.ContainerStatusRequest(container_id=cid)).status
            return True if st.state != cri.CONTAINER_CREATED else None

        try:
            self._call("StartContainer", cri.StartContainerRequest(container_id=cid), settle)
        except grpc.RpcError:
            if settle() is None:  # "already running" after a start that did happen is fine
                raise

    def remove_pod(self, pod_id: str) -> None:
        self._call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=pod_id),
                   done_codes=(grpc.StatusCode.NOT_FOUND,))
        self._call("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id),
                   done_codes=(grpc.StatusCode.NOT_FOUND,))

    def stop_and_remove(self, cid: str) -> None:
        # A grace period longer than the caller waits: for a stubborn container the call fails while
        # it still runs; kubelet tries again a while later, and then without grace.
        try:
            self.cri.rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=5), timeout=0.5)
        except grpc.RpcError:
            self.stats.add("cut_stops")
            time.sleep(self.rng.uniform(1.0, 3.0))  # kubelet's next sync
        self._call("StopContainer", cri.StopContainerRequest(container_id=cid, timeout=0),
                   done_codes=(grpc.StatusCode.NOT_FOUND,))
        self._call("RemoveContainer", cri.RemoveContainerRequest(container_id=cid),
                   done_codes=(grpc.StatusCode.NOT_FOUND,))

    # -- the churn ------------------------------------------------------------------------
    def new_pod(self) -> None:
        kinds = list(KINDS)
        kind = self.rng.choices(kinds, weights=[KINDS[k][2] for k in kinds])[0]
        cfg = pod_config(qos=KINDS[kind][0], logdir=str(self.workdir / "logs"))
        cfg.labels["soak-pod"] = cfg.metadata.uid
        pod_id = self.run_pod(cfg)
        self.pods.append(pod_id)
        for _ in range(1 if kind == "exclusive" else self.rng.choice((1, 2))):
            try:
                cid = self.create(pod_id, cfg, kind)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.stats.add("refused")
                self.pods.remove(pod_id)
                self.remove_pod(pod_id)
                return
            self.start(cid)

    def iterate(self) -> None:
        if len(self.pods) < 2 or self.rng.random() < 0.5:
            self.new_pod()
        else:
            pod_id = self.rng.choice(self.pods)
            listed = self._call("ListContainers", cri.ListContainersRequest(
                filter=cri.ContainerFilter(pod_sandbox_id=pod_id)))
            live = [c.id for c in listed.containers]
            if self.rng.random() < 0.5 and live:
                self.stop_and_remove(self.rng.choice(live))
            else:
                self.pods.remove(pod_id)
                self.remove_pod(pod_id)
        self.stats.add("iterations")

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.paused.is_set():
                    self.idle.set()
                    time.sleep(0.05)
                    continue
                self.idle.clear()
                try:
                    self.iterate()
                except grpc.RpcError as err:  # a call kubelet would not retry: note it, go on
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        self.stats.violations.append(f"worker call failed: {err.code().name}: {err.details()}")
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err
        finally:
            self.idle.set()


# -- what the node really runs ------------------------------------------------------------------
def shared_cpus(policy: str, exclusive: CPUSet) -> CPUSet:
    """Where every container without exclusive CPUs must run, CPU 0 being reserved: static's default set
    keeps the reserved CPUs; topology-aware's shared CPUs are the unreserved ones no exclusive grant holds,
    and the reserved ones once exclusive grants hold them all."""
    if policy == "static":
        return ONLINE - exclusive
    return (ONLINE - RESERVED_CPUS - exclusive) or RESERVED_CPUS


def holds_exclusively(kind: str, cpus: CPUSet) -> bool:
    """An exclusive container on a CPU of its own (one that did not fit runs on the shared or the
    reserved CPUs, which may be a single one too)."""
    return kind == "exclusive" and len(cpus) == 1 and not cpus & RESERVED_CPUS


def check(direct: Cri, stats: Stats, policy: str) -> list[str]:
    """What is wrong with the node now, reading only the runtime and the cgroups."""
    holders: dict[str, CPUSet] = {}
    others: dict[str, tuple[str, CPUSet]] = {}
    degraded = 0
    for c, cpus in live_cpusets(direct, LIVE):
        kind = c.labels.get("soak-kind", "?")
        if holds_exclusively(kind, cpus):
            holders[c.id] = cpus
        else:
            degraded += kind == "exclusive"
            others[c.id] = (kind, cpus)
    problems = []
    seen: dict[int, str] = {}
    for cid, cpus in holders.items():
        for cpu in cpus:
            if cpu in seen:
                problems.append(f"CPU {cpu} held exclusively by {seen[cpu][:12]} and {cid[:12]}")
            seen[cpu] = cid
    shared = shared_cpus(policy, CPUSet(seen))
    for cid, (kind, cpus) in others.items():
        if cpus != shared:
            problems.append(f"{kind} container {cid[:12]} runs on {cpus}; the shared CPUs are {shared}")
    if not problems:
        stats.degraded = max(stats.degraded, degraded)
    return problems


def monitor(socket: str, stats: Stats, stop: threading.Event) -> None:
    """A CPU held exclusively is never under another running container, not even for a moment."""
    watch_exclusive(socket, lambda c, cpus: holds_exclusively(c.labels.get("soak-kind", ""), cpus),
                    lambda c: c.labels.get("soak-kind", "?"), stats.violations, stop)


def made_before_answer(direct: Cri, workers: list[Kubelet], wait: float = 3.0) -> None:
    """Return as soon as containerd lists a container whose create has not yet returned to its worker."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        busy = [(w, w.creating) for w in workers if w.in_call == "CreateContainer" and w.creating]
        if not busy:
            time.sleep(0.002)
            continue
        w, label = busy[0]
        while w.in_call == "CreateContainer" and w.creating == label and time.monotonic() < deadline:
            try:
                if direct.rt.ListContainers(cri.ListContainersRequest(filter=cri.ContainerFilter(
                        label_selector={"soak-ctr": label})), timeout=1).containers:
                    return
            except grpc.RpcError:
                return  # containerd is away: kill now
        return


def answers(socket: str) -> bool:
    client = Cri(socket)
    try:
        return bool(client.rt.Version(cri.VersionRequest(), timeout=5).runtime_name)
    except grpc.RpcError:
        return False
    finally:
        client.close()


def converge(direct: Cri, stats: Stats, when: str, policy: str) -> None:
    """Give the relay CONVERGE seconds to repair; record how long it took, or what stayed wrong."""
    start = time.monotonic()
    while True:
        problems = check(direct, stats, policy)
        if not problems:
            stats.converge.append(time.monotonic() - start)
            break
        if time.monotonic() - start > CONVERGE:
            stats.violations.extend(f"{when}: {p}" for p in problems)
            break
        time.sleep(0.2)
    stats.checks += 1


@pytest.mark.parametrize("policy", ["static", "topology-aware"])
def test_soak_with_kills(workdir, policy, request):
    seconds = request.config.getoption("--soak-seconds")
    seed = request.config.getoption("--soak-seed") or random.randrange(1 << 32)
    print(f"\nsoak {policy}: --soak-seed {seed}, work directory {workdir}")
    rng = random.Random(seed)
    ctrd = PrivateContainerd().start()
    stats = Stats()
    direct = Cri(ctrd.socket)
    # CPU 0 reserved, reconciliation rounds at the default interval.
    relay = policy_relay(workdir, ctrd.socket, policy, reserved=f"cpuset:{RESERVED_CPUS}").start()

    def relaunch() -> RelayProcess:
        return policy_relay(workdir, ctrd.socket, policy, reserved=f"cpuset:{RESERVED_CPUS}",
                            relay_dir=relay.relay_dir).start()

    workers: list[Kubelet] = []
    done = threading.Event()
    try:
        sentinel = Kubelet(relay.socket, workdir, stats, rng)
        cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pod = sentinel.run_pod(cfg)
        sentinel.start(sentinel.create(pod, cfg, "besteffort"))  # a shared container that sees every change
        workers = [Kubelet(relay.socket, workdir, stats, random.Random(rng.random())) for _ in range(WORKERS)]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for t in threads:
            t.start()
        watching = threading.Thread(target=monitor, args=(ctrd.socket, stats, done), daemon=True)
        watching.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(rng.randint(1, 3)):  # kills close together
                time.sleep(rng.uniform(0.05, 1.5))
                fate = rng.random()
                aim = rng.random()
                if aim < 0.35:  # aimed at the end of a create: containerd made the container, its answer is
                    # not back yet (a retry of it then finds the name taken)
                    made_before_answer(direct, workers)
                elif aim < 0.7:  # aimed: inside a lifecycle call of some worker
                    wait_for = time.monotonic() + 3
                    while not any(w.in_call for w in workers) and time.monotonic() < wait_for:
                        time.sleep(0.002)
                    time.sleep(rng.uniform(0, 0.06))
                if relay.proc.poll() is not None:
                    stats.violations.append(f"cri-resmgr exited by itself with {relay.proc.returncode}")
                if fate < 0.3:  # containerd dies while the call is in it
                    stats.add("containerd_kills")  # first: a worker whose call fails may ask
                    ctrd.kill()
                if fate < 0.15:  # ... alone: cri-resmgr sees the calls fail
                    time.sleep(rng.uniform(0, 2.0))
                    ctrd.restart()
                    continue
                relay.stop(signal.SIGKILL)
                stats.relay_kills += 1
                if fate < 0.3:  # cri-resmgr is killed too, and may be back before containerd is
                    back = threading.Timer(rng.uniform(0, 2.0), ctrd.restart)
                    back.start()
                    time.sleep(rng.uniform(0, 1.0))
                    relay = relaunch()
                    back.join()
                    continue
                if fate < 0.4:  # containerd stops answering for a while
                    ctrd.proc.send_signal(signal.SIGSTOP)
                    stats.freezes += 1
                    threading.Timer(rng.uniform(0.5, 3.0), ctrd.proc.send_signal, (signal.SIGCONT,)).start()
                time.sleep(rng.uniform(0, 0.5))
                relay = relaunch()
            time.sleep(rng.uniform(0.5, 2.0))  # the workers go on against the new relay
            ctrd.proc.send_signal(signal.SIGCONT)
            for w in workers:
                w.paused.set()
            for w in workers:
                if not w.idle.wait(120):  # reported, not an invariant: the node is still checked
                    stats.stalls.append(f"a worker stuck in {w.in_call or 'no call'} for 120 s (last failure: "
                                        f"{w.last_error or 'none'}); "
                                        f"the relay {'answers' if answers(relay.socket) else 'does not answer'}")
            converge(direct, stats, f"after kill {stats.relay_kills}", policy)
            for w in workers:
                w.paused.clear()
        for w in workers:
            w.stop.set()
        for t in threads:
            t.join(120)
        converge(direct, stats, "at the end", policy)
        done.set()
        watching.join(30)
        if relay.proc.poll() is not None:
            stats.violations.append(f"cri-resmgr exited by itself with {relay.proc.returncode}")
        errors = [repr(w.error) for w in workers if w.error is not None]
        slowest = max(stats.converge, default=0.0)
        print(f"\nsoak {policy} (--soak-seed {seed}): {seconds:.0f}s, {stats.iterations} iterations, "
              f"{stats.calls} CRI calls "
              f"({stats.retries} retried, {stats.refused} creates refused for lack of CPUs, "
              f"{stats.reserved} for a name held by an earlier create), "
              f"{stats.relay_kills} cri-resmgr kills, {stats.containerd_kills} containerd kills, "
              f"{stats.freezes} containerd freezes, {stats.cut_stops} stops cut short, "
              f"{stats.checks} checks, slowest repair {slowest:.1f}s, {stats.degraded} degraded, "
              f"{len(stats.violations)} violations, {len(stats.stalls)} stalls")
        for stall in stats.stalls:
            print(f"soak {policy}: {stall}")
        print(f"soak {policy}: the longest a call took to succeed: {stats.longest[0]:.1f}s "
              f"(last failure: {stats.longest[1] or 'none'})")
        assert not errors, errors
        assert stats.violations == [], "\n".join(stats.violations[:20])
    finally:
        done.set()
        for w in workers:
            w.stop.set()
        if relay.proc is not None and relay.proc.poll() is None:
            relay.stop()
        direct.close()
        ctrd.stop()
