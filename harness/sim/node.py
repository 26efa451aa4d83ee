"""The simulated node: containerd's model, kubelet's model and cri-resmgr - the real engine and policy
behind the real CRI front end, or the real NRI plugin in NRI mode - on one virtual clock, cri-resmgr
killed and started again from its state directory at random moments. Its invariants are checked at
every change of a container's cgroup and whenever the node is quiet; a run is a seed, and the same
seed runs the same steps."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from harness.sim.clock import VirtualLoop, virtual_time
from harness.sim.containerd import CallError, Containerd, Cpusets, Quirks
from harness.sim.kubelet import Kubelet
from harness.sim.nri import Adaptation
from resmgr import policies
from resmgr.engine import Engine, NotReady, statefile
from resmgr.engine.store import StateStore
from resmgr.frontends.cri.lifecycle import CriLifecycle
from resmgr.frontends.cri.runtime import CriRuntime
from resmgr.frontends.nri.plugin import NriPlugin
from resmgr.frontends.nri.runtime import NriRuntime
from resmgr.policies import PolicyError
from resmgr.topology import generate as generate_module
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.model import Topology
from resmgr.topology.sysfs import discover

SHAPE = "sockets=2,nodes=2,cores=2,threads=2"  # the VM tier's node: 4 NUMA nodes of 4 CPUs
POLICY = {"Active": "topology-aware", "ReservedResources": {"cpu": "750m"}}
# What a switch pushes, as the soak's configurations (harness/soak/config.py) name them.
POLICIES: dict[str, dict[str, Any]] = {
    "topology-aware": POLICY,
    "static": {"Active": "static", "ReservedResources": {"cpu": "750m"}},
    "balloons": {"Active": "balloons", "ReservedResources": {"cpu": "750m"},
                 "balloons": {"BalloonTypes": [{"Name": "sim", "Namespaces": ["*"], "MaxCPUs": 6}]}},
    "podpools": {"Active": "podpools", "ReservedResources": {"cpu": "750m"},
                 "podpools": {"Pools": [{"Name": "sim", "CPU": 2, "MaxPods": 3, "Instances": 3}]}},
}
EXCLUSIVE = ("topology-aware", "static")  # the policies that give whole-CPU Guaranteed containers CPUs of their own
RECONCILE_EVERY = 30.0
FIRST_WAIT = 2.0  # the relay's: how long its start waits for the runtime before serving anyway
QUIET = 120.0  # seconds without a lifecycle call after which every cgroup must be as granted
SETTLE_BOUND = 150.0  # seconds a switch (and the rebuild of a life that cut it short) may take to land


REFUSALS = (NotReady, PolicyError)  # what cri-resmgr answers kubelet with on purpose


SHM = "/dev/shm"


@functools.cache
def _shape_tree() -> Path:
    """The node's sysfs tree, made once and kept for every process of every run (each run reads its
    own topology from it): a pool's worker processes end without their exit handlers, which would
    leave a tree of their own behind each time."""
    made_by = hashlib.sha256(SHAPE.encode() + Path(generate_module.__file__).read_bytes()).hexdigest()[:12]
    where = Path(SHM if os.path.isdir(SHM) else tempfile.gettempdir()) / f"crirm-sim-shape-{os.getuid()}-{made_by}"
    if not (where / "sys" / "devices" / "system" / "node").is_dir():
        made = Path(tempfile.mkdtemp(prefix="crirm-sim-shape-", dir=where.parent))
        generate(parse_spec(SHAPE), made)
        try:
            made.rename(where)  # whole or not at all: another process may be making it too
        except OSError:
            shutil.rmtree(made, ignore_errors=True)
    return where


class Violation(Exception):
    """An invariant broken: what, and when (virtual seconds)."""


class SimStore(StateStore):
    """The state directory of one life of cri-resmgr: once it is killed its writes reach nothing."""

    dead = False

    def write(self, data: dict[str, Any]) -> None:
        if not self.dead:
            super().write(data)


class Daemon:
    """One life of cri-resmgr, from its start to its SIGKILL: the relay in front of containerd, or
    (NRI mode) containerd's plugin."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.store = SimStore(node.state_dir)
        self.store.prepare()
        self.client = node.ctrd.client()
        policy = policies.create(node.policy["Active"], node.policy, node.topology)
        self.plugin: NriPlugin | None = None
        self.handlers: dict[str, Any] = {}
        if node.mode == "nri":
            runtime = NriRuntime()
            self.engine = Engine(policy, self.store, runtime, cpusets=Cpusets(node.ctrd), gated=True,
                                 write_behind=True)
            runtime.on_failure = self.engine.state.retry
            self.plugin = NriPlugin(self.engine, runtime)
        else:
            self.engine = Engine(policy, self.store, CriRuntime(self.client),  # type: ignore[arg-type]
                                 cpusets=Cpusets(node.ctrd), gated=True)
        self.engine.state.restore(self.store.load(statefile.check))
        if self.plugin is None:
            self.handlers = {path.rsplit("/", 1)[1]: h for path, h in CriLifecycle(self.engine).handlers().items()}
        # In the order made (a set iterates by address: the cancels of a kill would differ run to run).
        self.tasks: dict[asyncio.Task[Any], None] = {}
        self.serving = False
        self.spawn(self._start() if self.plugin is None else self._plug())

    async def _plug(self) -> None:
        """As the NRI plugin starts: its loops run, and it dials containerd, which configures and
        synchronizes it (the first reconciliation), and again whenever the connection closes."""
        assert self.plugin is not None and self.node.ctrd.nri is not None
        self.spawn(self.plugin.runtime.run_sender())
        self._serve()
        await self.node.ctrd.nri.register(self.plugin, self.spawn)

    async def _start(self) -> None:
        """As the relay starts: the runtime checked and reconciled once (2 s at most), then kubelet's
        socket served and the daemon's loops run; a first reconciliation that failed is tried again."""
        try:
            async with asyncio.timeout(FIRST_WAIT):
                await self.client.version()
                await self.engine.reconcile()
        except Exception:  # serving anyway: lifecycle calls wait for a reconciliation
            self.engine.state.wake()
        self._serve()

    def _serve(self) -> None:
        """Served from now on, the daemon's loops running."""
        self.serving = True
        self.spawn(self.engine.run_reconciler(RECONCILE_EVERY))
        self.spawn(self.engine.state.keep_written())
        if self.node.wanted != self.node.policy:  # the agent pushes again to a daemon that restarted
            self.spawn(self.node.push(self))

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks[task] = None
        task.add_done_callback(lambda t: self.tasks.pop(t, None))
        return task

    def kill(self) -> None:
        """SIGKILL: nothing of it reaches containerd or the disk from now on."""
        self.client.dead = self.store.dead = True
        if self.plugin is not None and self.node.ctrd.nri is not None:
            self.node.ctrd.nri.killed(self.plugin)
        for task in list(self.tasks):
            task.cancel()


@dataclass
class Node:
    seed: int
    steps: int = 200  # kubelet's actions
    crashes: int = 3  # SIGKILLs of cri-resmgr during the run
    freezes: int = 1  # containerd frozen (SIGSTOP) 5-60 s during the run
    restarts: int = 1  # containerd restarted (down 0.5-3 s) during the run
    losses: int = 1  # of the crashes, those that leave the state file cut short (set aside at the start)
    switches: int = 0  # configurations of another policy pushed during the run
    mode: str = "relay"  # or "nri": cri-resmgr as containerd's NRI plugin
    policy: dict[str, Any] = field(default_factory=lambda: dict(POLICY))
    quirks: Quirks = field(default_factory=Quirks)
    trace: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.topology: Topology = discover(str(_shape_tree()))
        self.online = CPUSet(self.topology.online)
        self.state_dir = Path()  # made when the run starts (a node made and not run leaves nothing)
        self.daemon: Daemon | None = None
        self.last_call = 0.0
        self.simulated = 0.0  # virtual seconds the run lasted
        self.failure: Violation | None = None
        self.wanted = self.policy  # the configuration the agent pushes; self.policy: the one persisted
        self.settled = True  # every cgroup follows the policy in force (not a switch's or a rebuild's mix)
        self.unsettled_at = 0.0  # when a switch began that has not landed yet
        self.in_force = self.policy["Active"]

    # -- kubelet's door: the relay, or containerd itself ----------------------------------------------
    async def call(self, req: Any, timeout: float) -> Any:
        """A CRI call of kubelet's, through cri-resmgr's relay (or straight to containerd in NRI
        mode); the errors kubelet would see."""
        loop = asyncio.get_running_loop()
        self.last_call = loop.time()
        if self.mode == "nri":
            return await self._direct(req, timeout)
        daemon = self.daemon
        if daemon is None or not daemon.serving:
            raise CallError(grpc.StatusCode.UNAVAILABLE, "connection refused: cri-resmgr is not running")
        name = type(req).__name__.removesuffix("Request")
        handler = daemon.handlers.get(name)
        if handler is None:
            work: Awaitable[Any] = self._send(req)
        else:
            work = handler(req, self._send, loop.time() + timeout)
        task = daemon.spawn(work)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        self.last_call = loop.time()
        if not done:
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{name}: deadline exceeded")
        if task.cancelled():
            raise CallError(grpc.StatusCode.UNAVAILABLE, f"{name}: the connection to cri-resmgr closed")
        err = task.exception()
        if err is None:
            return task.result()
        if isinstance(err, CallError):
            raise err
        if not isinstance(err, REFUSALS):  # the relay would answer UNKNOWN: a defect, not a refusal
            self.fail(Violation(f"{name}: cri-resmgr raised {type(err).__name__}: {err}"))
        code = getattr(err, "code", None)
        raise CallError(code() if callable(code) else grpc.StatusCode.UNKNOWN, f"{name}: {err}")

    async def _direct(self, req: Any, timeout: float) -> Any:
        """kubelet's call to containerd, which asks its NRI plugin on the way; containerd's work goes
        on when kubelet gives up on it."""
        name = type(req).__name__.removesuffix("Request")
        task = asyncio.ensure_future(self.ctrd.handle(req))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        self.last_call = asyncio.get_running_loop().time()
        if not done:
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{name}: deadline exceeded")
        err = task.exception()
        if err is None:
            return task.result()
        if not isinstance(err, CallError):  # the plugin raised what no RPC error carries: a defect
            self.fail(Violation(f"{name}: the NRI plugin raised {type(err).__name__}: {err}"))
            raise CallError(grpc.StatusCode.UNKNOWN, f"{name}: {err}")
        raise err

    async def _send(self, req: Any) -> Any:
        """The relay's call to containerd: once sent it happens, whatever becomes of the relay."""
        return await asyncio.shield(asyncio.ensure_future(self.ctrd.handle(req)))

    # -- cri-resmgr's lives ----------------------------------------------------------------------------
    def start_daemon(self) -> None:
        self.daemon = Daemon(self)
        self.note("cri-resmgr started")

    def kill_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()
            self.daemon = None
            self.note("cri-resmgr SIGKILLed")

    async def _runtime_faults(self, until: float) -> None:
        """containerd frozen and restarted at random moments (a generator of its own, so that the
        other choices of a seed stay as they were)."""
        rng = random.Random(self.seed * 7919 + 1)
        faults = ["freeze"] * self.freezes + ["restart"] * self.restarts
        rng.shuffle(faults)
        for fault in faults:
            await asyncio.sleep(rng.uniform(0, until / max(1, len(faults))))
            if fault == "freeze":
                seconds = rng.uniform(5.0, 60.0)
                self.ctrd.freeze(seconds)
                self.note(f"containerd frozen for {seconds:.0f} s")
            else:
                down = rng.uniform(0.5, 3.0)
                self.ctrd.restart(down)
                self.note(f"containerd restarted ({down:.1f} s down)")

    async def _crasher(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        lossy = random.Random(self.seed * 104729 + 2)  # its own: the other choices of a seed stay as they were
        losing = set(lossy.sample(range(self.crashes), min(self.losses, self.crashes)))
        for n in range(self.crashes):
            await asyncio.sleep(self.rng.uniform(0, until / max(1, self.crashes)))
            self.kill_daemon()
            if n in losing:
                self.cut_state(lossy)
            await asyncio.sleep(self.rng.uniform(0.5, 5.0))  # systemd's restart, the daemon's start-up
            self.start_daemon()
            if loop.time() > until:
                return

    async def _switcher(self, until: float) -> None:
        """Configurations of other policies pushed at random moments (a generator of its own)."""
        rng = random.Random(self.seed * 15485863 + 3)
        for _ in range(self.switches):
            await asyncio.sleep(rng.uniform(0, until / max(1, self.switches)))
            self.wanted = POLICIES[rng.choice(sorted(p for p in POLICIES if p != self.wanted["Active"]))]
            self.note(f"configuration of {self.wanted['Active']} pushed")
            if self.daemon is not None and self.daemon.serving:
                self.daemon.spawn(self.push(self.daemon))

    async def push(self, daemon: Daemon) -> None:
        """The agent's push, as the daemon applies it: a switch that re-allocates every container, and
        the configuration persisted once it is done (a kill before that starts the next life with the
        one before)."""
        wanted = self.wanted
        if daemon.engine.policy.name != wanted["Active"]:
            if self.settled:
                self.settled, self.unsettled_at = False, asyncio.get_running_loop().time()
            try:
                await daemon.engine.state.switch_policy(policies.create(wanted["Active"], dict(wanted), self.topology))
            except PolicyError as err:
                self.note(f"switch to {wanted['Active']} rejected: {err}")
        if daemon.engine.policy.name == wanted["Active"]:
            self.policy = wanted

    def settle(self) -> None:
        """A switch, or the rebuild of a life started on one cut short, has landed once cri-resmgr has
        reconciled and sent every container its desired resources: the invariants of the policy in
        force hold from then on. Violation: not landed within SETTLE_BOUND."""
        if self.settled or self.daemon is None:
            return
        state = self.daemon.engine.state
        delivering = getattr(state.runtime, "delivering", lambda cid: False)  # NRI: queued for UpdateContainers
        if state.reconciled.is_set() and not any(c.pending or delivering(c.id) for c in state.containers.values()):
            self.in_force = state.policy.name
            self.settled = True
            for c in self.ctrd.containers.values():  # placed by the synchronization that unsettled it
                c.unplugged = False
            self.note(f"{self.in_force} settled")
        elif asyncio.get_running_loop().time() - self.unsettled_at > SETTLE_BOUND:
            pending = sorted(k for k, c in state.containers.items() if c.pending)
            raise Violation(f"a switch to {state.policy.name} not landed after {SETTLE_BOUND:.0f} s: "
                            f"{len(pending)} container(s) pending ({', '.join(pending[:4])})")

    def synchronized(self) -> None:
        """The NRI plugin synchronized with containers made without it: the invariants wait for them
        to be placed, as for a switch."""
        if any(c.unplugged for c in self.ctrd.containers.values()) and self.settled:
            self.settled, self.unsettled_at = False, asyncio.get_running_loop().time()

    def cut_state(self, rng: random.Random) -> None:
        """The state file cut short (the soak's corrupt-state fault): the next life sets it aside and
        adopts what the runtime runs."""
        for path in self.state_dir.iterdir():
            if path.is_file() and not path.name.startswith(".") and ".broken-" not in path.name:
                data = path.read_bytes()
                path.write_bytes(data[:rng.randrange(max(1, len(data)))])
                self.note(f"state file {path.name} cut to {path.stat().st_size} of {len(data)} bytes")

    # -- the invariants ---------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.trace.append(f"{asyncio.get_running_loop().time():10.3f} {text}")

    def exclusive(self, cid: str) -> bool:
        """A Guaranteed container of whole CPUs: topology-aware gives it CPUs of its own."""
        c = self.ctrd.containers[cid]
        sb = self.ctrd.sandboxes.get(c.pod_id)
        res = c.config.linux.resources
        guaranteed = sb is not None and "/besteffort/" not in sb.config.linux.cgroup_parent and \
            "/burstable/" not in sb.config.linux.cgroup_parent
        return guaranteed and res.cpu_quota > 0 and res.cpu_quota % res.cpu_period == 0

    def check(self) -> None:
        """After every change of a cgroup: no exclusive CPU under two running containers (where the
        policy in force gives any, and not while a switch or a rebuild after one moves containers)."""
        if self.failure is not None:
            return
        try:
            if self.ctrd.broken:
                raise Violation(self.ctrd.broken[0])
            self.settle()
            if not self.settled or self.in_force not in EXCLUSIVE:
                return
            # Made or started without the NRI plugin (its window: set apart, as the soak does) until a
            # synchronization has placed them.
            running = [(c.id, c.cpus) for c in self.ctrd.running() if not c.unplugged]
            for cid, cpus in running:
                if not self.exclusive(cid):
                    continue
                for oid, ocpus in running:
                    if frozenset((cid, oid)) in self.ctrd.swapping:
                        continue  # a swap being applied in one call: see Containerd._swaps
                    if oid != cid and cpus & ocpus:
                        raise Violation(f"exclusive CPUs {cpus & ocpus} of {cid} ({cpus}) under {oid} ({ocpus})")
        except Violation as err:
            self.fail(err)

    def fail(self, err: Violation) -> None:
        if self.failure is None:
            self.note(f"VIOLATION: {err}")
            self.failure = err
            self.failed.set()

    def check_quiet(self) -> None:
        """The node quiet for a while: every running container's cgroup as cri-resmgr granted it."""
        if self.daemon is None:
            return
        known = self.daemon.engine.state.containers
        for c in self.ctrd.running():
            mine = known.get(c.id)
            if mine is None:
                raise Violation(f"{c.id} runs and cri-resmgr does not know it, quiet for {QUIET:.0f} s")
            granted = CPUSet.parse(mine.resources.cpuset_cpus) if mine.resources.cpuset_cpus else self.online
            if granted != c.cpus:
                raise Violation(f"{c.id} runs on {c.cpus}, granted {granted}, quiet for {QUIET:.0f} s")

    def check_empty(self) -> None:
        """Every pod gone: nothing left granted or remembered."""
        if self.daemon is None:
            return
        state = self.daemon.engine.state
        if state.containers or state.pods:
            raise Violation(f"every pod gone, cri-resmgr still holds {len(state.pods)} pods, "
                            f"{len(state.containers)} containers")

    # -- the run ---------------------------------------------------------------------------------------
    async def _watch(self) -> None:
        """The quiet node's check, every few seconds; returns at the first violation."""
        loop = asyncio.get_running_loop()
        while not self.failed.is_set():
            self.check()  # a switch may land without a cgroup changing
            if self.daemon is not None and loop.time() - self.last_call > QUIET and \
                    self.daemon.engine.state.reconciled.is_set():
                try:
                    self.check_quiet()
                except Violation as err:
                    self.fail(err)
                self.last_call = loop.time()
            try:
                async with asyncio.timeout(5.0):
                    await self.failed.wait()
            except TimeoutError:
                pass

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self.ctrd = Containerd(self.rng, loop, self.online, self.quirks)
        self.ctrd.on_change = self.check
        if self.mode == "nri":  # containerd before 2.4, whose UpdateContainers can deadlock, or after
            self.ctrd.nri = Adaptation(self.ctrd, "v2.3.7" if self.seed % 2 else "v2.4.0", self.synchronized)
            self.ctrd.nri.note = self.note
        self.failed = asyncio.Event()
        self.start_daemon()
        work = asyncio.ensure_future(self._work(Kubelet(self, random.Random(self.rng.random()))))
        watch = asyncio.ensure_future(self._watch())
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if self.failure is not None:
                raise self.failure
            work.result()
        finally:
            self.simulated = loop.time()
            work.cancel()
            watch.cancel()
            if self.daemon is not None:
                self.daemon.kill()

    async def _work(self, kubelet: Kubelet) -> None:
        crasher = asyncio.ensure_future(self._crasher(self.steps * 2.0))
        faults = asyncio.ensure_future(self._runtime_faults(self.steps * 2.0))
        switcher = asyncio.ensure_future(self._switcher(self.steps * 2.0))
        try:
            await kubelet.run(self.steps)
            await crasher
            await faults
            await switcher
            await kubelet.delete_all()
            await asyncio.sleep(QUIET + 2 * RECONCILE_EVERY)  # reconciliation drops what it missed
            self.check_empty()
        finally:
            crasher.cancel()
            faults.cancel()
            switcher.cancel()

    def run(self) -> None:
        """The whole run; Violation if an invariant broke."""
        loop = VirtualLoop()
        # In memory where it can be: the simulated crash decides what a write leaves, not the disk.
        self.state_dir = Path(tempfile.mkdtemp(prefix="crirm-sim-", dir=SHM if os.path.isdir(SHM) else None))
        logging.disable(logging.CRITICAL)
        try:
            with virtual_time(loop):
                loop.run_until_complete(self._main())
        finally:
            logging.disable(logging.NOTSET)
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                with virtual_time(loop):
                    loop.run_until_complete(_drained(left))
            loop.close()
            shutil.rmtree(self.state_dir, ignore_errors=True)



async def _drained(tasks: set[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)
