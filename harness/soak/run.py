"""The soak: a production-shaped node under a churn of pods and configuration changes, struck by
every fault a node sees, at random moments, and judged from the kernel all along.

The faults, each a kind of its own: cri-resmgr SIGKILLed (systemd restarts it); the agent
SIGKILLed; containerd restarted; kubelet restarted; the API server away for a while; the state
directory's file system full for a while (cri-resmgr SIGKILLed once meanwhile); containerd frozen
(SIGSTOP) for longer than kubelet's runtime request timeout; a configuration every node rejects,
then its fix; cri-resmgr's state file cut in half and cri-resmgr SIGKILLed; and once per run the
node rebooted. Once per run, too, the node is crowded (Guaranteed pods made until cri-resmgr
refuses one, then room made, which the refused pod must take), the package is rolled back to the
previous release and upgraded again (where that release's package was built), and a violation is
planted for the judge to catch. After each the soak waits until the node is whole
again (harness/soak/run.py: Soak.whole) and records how long that took.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiException, CustomObjectsApi

from harness.kube import ControlPlane, container_ids, statuses
from harness.soak import config as cfg
from harness.soak.guest import PACKAGE, PREVIOUS, SAMPLES, STATE_DIR, Guest
from harness.soak.judge import (
    Judge,
    Machine,
    Violation,
    away_windows,
    nri_windows,
    refused_windows,
    upgrade_windows,
)
from harness.soak.load import (
    ADMITTED,
    DRIVER,
    NAMESPACE,
    TEMPLATES,
    Load,
    PodRecord,
    claim_templates,
    refusal,
    running,
)
from harness.soak.proxy import CountingProxy
from harness.soak.report import Strike, fault_table, placements_kept, slope
from harness.vm import Shape, Vm
from harness.vmnode import NODE_NAME, RELAY_SOCKET
from resmgr.topology.cpuset import CPUSet
from tests.support.agentenv import install_agent_rbac, install_crds

WHOLE_EVERY = 10.0  # seconds between two looks at whether the node is whole again
SETTLE = 180.0  # seconds a configuration change is given to reach the kernel before a reboot, at most
CROWD_BOUND = 300.0  # seconds the crowd waits for a refusal, and then for the refused pod to run
REFUSING = ("topology-aware", "static")  # the policies whose exclusive CPUs a crowd takes to the last
SAID_BEFORE = 60.0  # seconds of cri-resmgr's warnings before a violation the report carries
FAULTS = ("kill-resmgr", "kill-agent", "restart-containerd", "restart-kubelet", "api-away", "disk-full",
          "freeze-containerd", "bad-config", "corrupt-state")


@dataclass
class Timing:
    """How long faults last; the defaults are the production-sized ones of the hour-long run."""

    api_away: float = 180.0
    disk_full: float = 120.0
    runtime_timeout: float = 120.0  # kubelet's runtimeRequestTimeout (its default: 2m)
    freeze: float = 150.0  # containerd frozen, longer than runtime_timeout
    config_every: float = 240.0
    warmup: float = 90.0
    whole_within: float = 600.0  # a fault whose node is not whole by then is a violation
    pod_bound: float = 600.0  # a pod that does not run this long after it was made is lost


@dataclass
class Settings:
    duration: float
    mode: str = "relay"
    seed: int = 0
    per_kind: int = 2  # strikes of each fault kind
    faults: tuple[str, ...] = FAULTS
    reboot: bool = True
    timing: Timing = field(default_factory=Timing)
    daemon_options: str = ""  # more options of cri-resmgr (the package's CRI_RESMGR_OPTIONS)
    policy: str = "topology-aware"  # the policy the run starts in (its first change switches away)


# The short form's forms, one per seed in turn (seed % len): the front end, the policy the run starts
# in (its first change switches to another), and whether the node reboots. Over eight seeds CI
# sees each mode start in each policy, and a reboot in each mode and starting in each policy.
ROTATION = (("relay", "topology-aware", True), ("nri", "balloons", False), ("relay", "static", False),
            ("nri", "podpools", True), ("nri", "topology-aware", False), ("relay", "balloons", True),
            ("nri", "static", True), ("relay", "podpools", False))


def form_of(seed: int) -> tuple[str, str, bool]:
    return ROTATION[seed % len(ROTATION)]


def again(settings: Settings) -> str:
    """The one command that runs this soak again."""
    return (f".venv/bin/python benchmarks/soak.py --duration {settings.duration:.0f}s --mode {settings.mode} "
            f"--policy {settings.policy} --{'' if settings.reboot else 'no-'}reboot --seed {settings.seed}")


def crowd_later(plan: list[str], policy: str) -> None:
    """The crowd due next under a policy that refuses no Guaranteed pod for want of CPUs goes after
    the next fault (a later policy may hold exclusive CPUs to run out of); last, it strikes anyway."""
    if plan and plan[0] == "crowd" and len(plan) > 1 and policy not in REFUSING:
        plan.insert(1, plan.pop(0))


def machine_of(shape: Shape) -> Machine:
    nodes = tuple(CPUSet.parse(shape.node_cpus(n)) for n in range(shape.nodes))
    sockets = tuple(tuple(range(s * shape.nodes_per_socket, (s + 1) * shape.nodes_per_socket))
                    for s in range(shape.sockets))
    return Machine(nodes, sockets)


class Soak:
    def __init__(self, guest: Guest, control: ControlPlane, proxy: CountingProxy, shape: Shape,
                 settings: Settings) -> None:
        self.guest, self.control, self.proxy, self.settings = guest, control, proxy, settings
        self.timing = settings.timing
        self.rng = random.Random(settings.seed)
        core = control.core()
        self.configs = cfg.Configs(core, CustomObjectsApi(control.api_client()), NODE_NAME, self.rng)
        self.load = Load(control.core(), NODE_NAME, random.Random(self.rng.random()))
        self.judge = Judge(machine_of(shape), cfg.expect_of(cfg.GROUPS[cfg.START[settings.policy]]),
                           claimed=self.load.claimed, unclaimed=self.load.unclaimed)
        self.strikes: list[Strike] = []
        self.violations: list[tuple[str, str]] = []  # the soak's own (pods, restarts, never whole)
        self.procs: list[dict[str, Any]] = []
        self.state_max = 0
        self.snapshot: dict[str, list[str]] = {}
        self._lock = threading.Lock()  # the judge and the snapshot, between the puller and the rest
        self._offset = 0
        self._stop = threading.Event()  # the threads end
        self._ending = threading.Event()  # the run ends early
        self._pulling = threading.Event()
        self._pulling.set()
        self._restarts: dict[tuple[str, str], int] = {}
        self.leftovers: set[str] = set()  # the runtime's own leftover scopes
        self._known: dict[str, str] = {}  # container IDs the API server's pods have -> "pod/container"
        self._expected: set[str] = set()  # ... of those, the running ones of pods not being deleted
        self._found: dict[str, dict[str, float]] = {}  # by kind of finding: container -> found first
        self._lost: set[str] = set()
        self._rejected = False  # the configuration in force is the broken one
        self._excused = False  # restarts are the fault's: the reboot's, or calls in flight through a killed relay
        self._excused_restarts: list[str] = []
        self._before_reboot: dict[tuple[str, str], str] | None = None
        self._switching_at_reboot = False
        self.started = self.started_wall = 0.0
        self.notes: dict[str, Any] = {}
        self.evidence: list[str] = []  # journal lines of what a violation of the soak's own was stuck on
        self.plants: list[Plant] = []
        # [guest time, "start" or "change", policy, reserved, max balloon], [t, "applied"] or
        # [thaw, "stalled", freeze] (containerd frozen by the soak)
        self.events: list[list[Any]] = []
        self.kills: list[float] = []  # when the soak SIGKILLed cri-resmgr (guest clock)
        self.restarts: list[float] = []  # ... restarted containerd or rebooted the node
        self.upgrades: list[float] = []  # ... installed the package (it restarts the daemon)

    # -- the sampler's records -------------------------------------------------------------------
    def pull(self) -> None:
        """Runs in a thread: read the sampler's new records, judge the snapshots."""
        buf = b""
        while not self._stop.wait(5.0):
            if not self._pulling.is_set():
                continue
            try:
                chunk = self.guest.tail(SAMPLES, self._offset)
            except Exception:  # the guest is rebooting, or busy: next time
                continue
            data = buf + chunk
            end = data.rfind(b"\n") + 1
            self._offset += len(chunk)
            buf = data[end:]
            for line in data[:end].splitlines():
                self._record(line)

    def _record(self, line: bytes) -> None:
        try:
            rec = json.loads(line)
        except ValueError:
            return
        if rec["kind"] == "cg":
            with self._lock:
                self.snapshot = rec["c"]
                self.judge.feed(rec["t"], rec["c"])
        elif rec["kind"] == "read":
            with self._lock:
                self.judge.glance(rec["t"], rec["c"])
        elif rec["kind"] == "proc":
            self.procs.append(rec)
            self.state_max = max(self.state_max, rec.get("state", 0))

    def wait_fresh(self, since: float, timeout: float = 60.0) -> bool:
        """Until the judge has seen a snapshot taken after since (guest clock)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.judge.last_time > since:
                    return True
            time.sleep(1)
        return False

    # -- the run ---------------------------------------------------------------------------------
    def _applied_first(self, bound: float = 300.0) -> None:
        """Until the node reports the configuration the run starts in applied (the package starts it
        in the fallback, topology-aware): the judging starts on a node that follows it."""
        began = time.monotonic()
        while (why := self.configs.status_current()) and time.monotonic() - began < bound:
            time.sleep(2)
        if why:  # what the node's daemons said, for a run whose journals are not kept (CI's)
            said = self.guest.run(f"systemctl status --no-pager {self.guest.unit} cri-resmgr-agent | head -40; "
                                  f"journalctl --no-pager -n 40 -u {self.guest.unit} -u cri-resmgr-agent", timeout=60)
            raise RuntimeError(f"the node never applied the configuration the soak starts in: {why}\n{said.out}")
        print(f"soak: the node runs {self.settings.policy} after {time.monotonic() - began:.0f} s", flush=True)

    def baseline(self) -> dict[str, float]:
        """How long a pod takes to run and to go on this node at rest: what times to whole compare with."""
        from harness.soak.load import KINDS, manifest

        core = self.control.core()
        began = time.monotonic()
        core.create_namespaced_pod(NAMESPACE, manifest("baseline", NODE_NAME, KINDS["g1"][0]))
        while not running(core.read_namespaced_pod("baseline", NAMESPACE), 1):
            time.sleep(1)
        up = time.monotonic() - began
        began = time.monotonic()
        core.delete_namespaced_pod("baseline", NAMESPACE)
        while any(p.metadata.name == "baseline" for p in core.list_namespaced_pod(NAMESPACE).items):
            time.sleep(1)
        return {"pod runs after s": round(up, 1), "pod gone after s": round(time.monotonic() - began, 1)}

    def run(self) -> dict[str, Any]:
        self.configs.setup(self.settings.policy)
        self._applied_first()
        first = self.configs.expect()
        self._claims_for(first.policy)
        self.events.append([self.guest.now(), "start", first.policy, str(first.reserved), first.max_balloon])
        self.notes["node at rest"] = self.baseline()
        self._offset = int(self.guest.sh(f"stat -c %s {SAMPLES} 2>/dev/null || echo 0"))  # judged from now on
        threads = [threading.Thread(target=self.pull, name="soak-pull", daemon=True),
                   threading.Thread(target=self.load.run, name="soak-load", daemon=True)]
        for t in threads:
            t.start()
        self.started, self.started_wall = time.monotonic(), time.time()
        deadline = self.started + self.settings.duration
        plan = [k for k in self.settings.faults for _ in range(self.settings.per_kind)]
        self.rng.shuffle(plan)
        if self.settings.reboot:
            plan.insert(self.rng.randrange(len(plan) // 2, len(plan) + 1) if plan else 0, "reboot")
        plan.insert(self.rng.randrange(len(plan) + 1), "plant")  # once per run, the judge proven live
        plan.insert(self.rng.randrange(len(plan) + 1), "crowd")  # once per run, every exclusive CPU taken
        if self.guest.has_previous():  # once per run, a rollback to the previous release and back
            plan.insert(self.rng.randrange(len(plan) + 1), "upgrade")
        else:
            self.notes["upgrade"] = "not struck: no previous release's package on the node"
        self._between(self.timing.warmup)
        try:
            while plan and not self._ending.is_set():
                left = deadline - time.monotonic()
                gap = max(10.0, left / (len(plan) + 1)) * self.rng.uniform(0.3, 1.0) if left > 0 else 5.0
                self._between(gap)
                crowd_later(plan, self.configs.expect().policy)
                if plan[0] == "reboot":
                    self._settle()
                    self._guaranteed_for_reboot()
                self.strike(plan.pop(0))
            while time.monotonic() < deadline and not self._ending.is_set():
                self._between(deadline - time.monotonic())
            # The end: the churn stops and every finding must clear (the judge counts what does not).
            self.load.paused.set()
            final = Strike("end", time.monotonic(), time.monotonic(), self.guest.now())
            self.wait_whole(final)
            self.notes["whole at the end"] = bool(final.whole)
        except Exception as err:  # the run ends early; what ran is reported
            self.violations.append(("soak-error", f"{type(err).__name__}: {str(err)[:300]}"))
            print(f"soak {self.elapsed()}: ended early: {type(err).__name__}: {err}", flush=True)
        finally:
            self.load.stop()
            self._stop.set()
            for t in threads:
                t.join(30)
        return self.report()

    def _between(self, seconds: float) -> None:
        """Churn goes on; a configuration changes when one is due."""
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end and not self._ending.is_set():
            last = self.configs.log[-1][0] if self.configs.log else self.started
            if now - last >= self.timing.config_every * self.rng.uniform(0.8, 1.2):
                what = self.configs.change(self._before_switch)
                expect, t = self.configs.expect(), self.guest.now()
                self._claims_for(expect.policy)
                with self._lock:
                    self.judge.change(expect, t)
                self.events.append([t, "change", expect.policy, str(expect.reserved), expect.max_balloon])
                print(f"soak {self.elapsed()}: configuration: {what}", flush=True)
            self._note_applied()
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))

    def _claims_for(self, policy: str) -> None:
        """Pods of DRA claims are made while the policy offers the devices they claim."""
        if policy in CLAIMING_POLICIES:
            self.load.claiming.set()

    def _before_switch(self, policy: str) -> None:
        """Before a switch to a policy that offers no device of the claims (which would refuse the
        switch: docs/dra.md), their pods go, and kubelet unprepares the claims."""
        if policy in CLAIMING_POLICIES:
            return
        self.load.claiming.clear()
        deadline = time.monotonic() + CLAIMS_GONE
        prepared: int | str = "?"
        while time.monotonic() < deadline:
            dropped = self.load.drop_claims()  # again: one made as claiming ended
            try:
                self.load.look()
                prepared = self.guest.inspect()["state"].get("claims", "?")
            except Exception as err:  # the API server or the guest busy: look again
                prepared = f"? ({type(err).__name__})"
            if not dropped and prepared == 0 and not any(p.claim and not p.gone for p in self.load.pods.values()):
                return
            time.sleep(5)
        self.violations.append(("claims", f"claims prepared ({prepared}) {CLAIMS_GONE:.0f} s after their pods "
                                          f"were deleted, before a switch to {policy}"))
        stuck = [p.name for p in self.load.pods.values() if p.claim and not p.gone]
        self.evidence += self._lines_about(stuck or ["claim"], self.guest.now() - CLAIMS_GONE - 60)

    def _note_applied(self) -> None:
        """Tell the judge when the node reports the change in flight applied (the switch excuse ends
        a grace later)."""
        with self._lock:
            waiting = self.judge.previous is not None and self.judge.switch_applied is None
        if not waiting:
            return
        try:
            if not self.configs.status_current(self._rejected):
                t = self.guest.now()
                with self._lock:
                    self.judge.applied(t)
                self.events.append([t, "applied"])
        except Exception:  # the API server or the guest busy: next time (the switch's bound holds)
            pass

    def _settle(self) -> None:
        """Churn without configuration changes until the change in flight is done (a snapshot follows
        it), SETTLE s after it at most: a reboot then judges whether placements come back, not whether
        a switch's moves had reached the kernel."""
        last = self.configs.log[-1][0] if self.configs.log else 0.0
        while self._in_flight() and time.monotonic() - last < SETTLE and not self._ending.is_set():
            time.sleep(1.0)

    def _in_flight(self) -> bool:
        with self._lock:
            return self.judge.previous is not None

    def _guaranteed_for_reboot(self, want: int = 2, bound: float = 300.0) -> None:
        """At least two Guaranteed pods running when the node reboots, so that it shows whether
        their CPUs come back; the churn pauses meanwhile (it would delete them as soon)."""
        self.load.paused.set()
        try:
            end = time.monotonic() + bound
            while time.monotonic() < end and not self._ending.is_set():
                self.load.look()
                alive, running = self.load.guaranteed()
                if running >= want:
                    time.sleep(2 * WHOLE_EVERY)  # in the sampler's snapshot too
                    return
                if alive < want:
                    self.load.make("g1")
                time.sleep(5.0)
            print(f"soak {self.elapsed()}: fewer than {want} Guaranteed pods running at the reboot", flush=True)
        finally:
            self.load.paused.clear()

    def stop(self) -> None:
        """End the run early (the report covers what ran)."""
        self._ending.set()

    def elapsed(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"{s // 60:02d}:{s % 60:02d}"

    def strike(self, kind: str) -> Strike:
        s = Strike(kind, time.monotonic())
        self._restarts_before(kind)
        print(f"soak {self.elapsed()}: {kind}", flush=True)
        try:
            getattr(self, "_" + kind.replace("-", "_"))(s)
        except Exception as err:  # the fault's own checks did not run: a violation, not a note
            s.notes["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            print(f"soak {self.elapsed()}: {kind}: {s.notes['error']}", flush=True)
            self.violations.append(("strike-error", f"{kind}: {s.notes['error']}"))
            self._undo(kind)
        if not s.recovered:
            s.recovered = time.monotonic()
        try:
            s.recovered_guest = self.guest.now()
        except Exception:  # a busy guest: its clock follows the host's
            s.recovered_guest = time.time()
        self.strikes.append(s)
        self.wait_whole(s)
        self._excused = False
        if self._excused_restarts:
            s.notes["restarts excused"] = self._excused_restarts
            self._excused_restarts = []
        if kind == "reboot":
            self._judge_reboot(s)
        print(f"soak {self.elapsed()}: {kind} whole after "
              f"{s.to_whole if s.to_whole is not None else 'never'} s {s.notes or ''}", flush=True)
        return s

    def _restarts_before(self, kind: str) -> None:
        """Restarts are counted before each strike, so one the strike did not cause (a policy
        switch's, say) is not excused by it."""
        for attempt in range(3):
            try:
                self._pods(time.monotonic())
                return
            except Exception as err:  # the API server busy: again, then the strike's own count
                if attempt == 2:
                    print(f"soak {self.elapsed()}: restarts before {kind} not read: {err}", flush=True)
                time.sleep(2)

    def _judge_reboot(self, s: Strike) -> None:
        """Exclusive CPUs come back to the pods that had them (docs/limitations.md: under
        topology-aware a reservation; under balloons a preference a new pod may take)."""
        self.load.spared = set()
        if self._before_reboot is None or not s.whole:
            return
        s.notes.update(placements_kept(self._before_reboot, self._placements()))  # the pods' new containers
        if self._switching_at_reboot:  # the kernel may still have held the old policy's CPUs: no verdict
            s.notes["placements kept"] += " (struck while a configuration change was in flight)"
        elif s.notes.get("placements moved") and s.notes.get("policy") == "topology-aware":
            self.violations.append(("reboot-moved", "; ".join(s.notes["placements moved"])))

    def _undo(self, kind: str) -> None:
        """Take a fault's cause away after its step failed half-way (each step does so itself otherwise)."""
        undo = {"disk-full": self.guest.free_state_fs,
                "freeze-containerd": lambda: self.guest.sh(f"kill -CONT {self.guest.main_pid('containerd')}"),
                "api-away": lambda: self.control.apiserver.alive() or self.control.start_apiserver()}
        if kind in undo:
            try:
                undo[kind]()
            except Exception as err:
                print(f"soak {self.elapsed()}: undoing {kind}: {type(err).__name__}: {err}", flush=True)

    # -- whole again -----------------------------------------------------------------------------
    def wait_whole(self, s: Strike) -> None:
        deadline = s.recovered + self.timing.whole_within
        self._found = {}
        told = time.monotonic()
        while True:
            try:
                s.reasons = self.whole(s)
            except Exception as err:  # the guest or the API server not answering yet
                s.reasons = [f"{type(err).__name__}: {str(err)[:300]}"]
            if not s.reasons:
                s.whole = time.monotonic()
                return
            self._note_applied()
            if time.monotonic() - told > 60:
                print(f"soak {self.elapsed()}: not whole yet: {'; '.join(s.reasons)[:600]}", flush=True)
                told = time.monotonic()
            if time.monotonic() > deadline:
                self.violations.append(("not-whole", f"{s.kind}: not whole {self.timing.whole_within:.0f} s after: "
                                                     f"{'; '.join(s.reasons)[:1000]}"))
                return
            time.sleep(WHOLE_EVERY)

    def whole(self, s: Strike) -> list[str]:
        """What keeps the node from being whole now (nothing: it is). What the API server tells comes
        first: the guest is asked only once that is right (asking costs the emulated node)."""
        reasons = self._pods(s.recovered)
        if (why := self.configs.status_current(self._rejected)):
            reasons.append(why)
        if reasons:
            return reasons
        info = self.guest.inspect()
        down = {u: st for u, st in info["units"].items() if st != "active"}
        if down:
            reasons.append(f"units not active: {down}")
        if self.guest.mode == "relay" and not info["relay_socket"]:
            reasons.append("no relay socket")
        if info["containers"] is None or info["sandboxes"] is None:
            return [*reasons, "containerd does not answer"]
        known = set(info["containers"]) | set(info["sandboxes"])
        with self._lock:
            runs = {cid: v[5] for cid, v in self.snapshot.items()}
        stray = [c for c in info["scopes"] if c not in known]
        # A scope that holds nothing, or runc's init alone, is one containerd failed to make and did
        # not clean up (seen when it is starved): the runtime's leftover, noted, not cri-resmgr's.
        leftovers = [c[:12] for c in stray if runs.get(c, "none") in ("none", "created")]
        if leftovers:
            self.leftovers.update(leftovers)
        live = [c[:12] for c in stray if runs.get(c) in ("started", "pause")]
        if live:
            reasons.append(f"container scopes running what containerd does not have: {live}")
        state = info["state"]
        if "error" in state:
            reasons.append(f"state file: {state['error']}")
        else:
            gone = [c[:12] for c in state["containers"] if c not in info["containers"]]
            if gone:
                reasons.append(f"the state file holds containers containerd no longer has: {gone}")
            unknown = [c[:12] for c in info["running"] or [] if c not in state["containers"]]
            if unknown:
                reasons.append(f"running containers the state file does not hold: {unknown}")
        if info["failing"] is None or any(info["failing"].values()):
            reasons.append(f"state writes failing: {info['failing']}")
        if not self.wait_fresh(s.recovered_guest, 20):
            return [*reasons, "no fresh snapshot from the sampler"]
        with self._lock:
            stuck, snapshot, lingering = self.judge.stuck(), dict(self.snapshot), self.judge.lingering()
        if stuck:
            reasons.append(f"the kernel breaks an invariant: {[v.text for v in stuck][:3]}")
        if s.kind == "end" and lingering:
            reasons.append(f"findings open at the end, excused until now: {[v.text for v in lingering][:3]}")
        started = {cid for cid, v in snapshot.items() if v[5] == "started"}
        runtime = info.get("described") or {}
        if "placed" in state:
            off = disagree(state["placed"], snapshot)
            said = [f"{c[:12]}: cri-resmgr says {off[c]}; {age:.0f} s" for c, age in self._lasting("word", set(off))]
            if said:
                reasons.append(f"cri-resmgr's word against the kernel: {said[:5]}")
        stray = [f"{c[:12]} ({runtime.get(c[:12], 'not in containerd')}; runs {snapshot[c][6]}; {age:.0f} s)"
                 for c, age in self._lasting("stray", started - self._known.keys())]
        if stray:
            reasons.append(f"containers run that no pod has: {stray}")
        missing = [f"{c[:12]} ({self._known.get(c, '?')}; {runtime.get(c[:12], 'not in containerd')}; "
                   f"scope {snapshot[c][5] if c in snapshot else 'none'}; {age:.0f} s)"
                   for c, age in self._lasting("missing", self._expected - started)]
        if missing:
            reasons.append(f"containers of running pods do not run: {missing}")
        if s.kind == "reboot":
            reasons += self._unreported(started)
        return reasons

    def _unreported(self, started: set[str]) -> list[str]:
        """After a reboot: the API server shows the containers of before it running until kubelet
        reports their new ones, and their restart counts, which the reboot excuses; so no lag is
        allowed there (a count taken after the reboot's strike would be a restart of no cause)."""
        stale = self._expected - started
        if not stale:
            return []
        return [f"kubelet has not reported the containers made since the reboot: "
                f"{sorted(self._known.get(c, c[:12]) for c in stale)[:5]}"]

    def _lasting(self, kind: str, found: set[str]) -> list[tuple[str, float]]:
        """Of the containers found (of a kind) now, those found in every look for kubelet's runtime
        request timeout or longer, with how long. A shorter one is kubelet's status catching up
        with the kernel: a container runs before its StartContainer returns, which may take that
        long (a start waits for the moves off its CPUs), and on the emulated node under churn a
        look at a moment with no such lag at all may not come within the bound."""
        lag = self.timing.runtime_timeout
        now = time.monotonic()
        first = self._found.setdefault(kind, {})
        for cid in set(first) - found:
            del first[cid]
        for cid in found:
            first.setdefault(cid, now)
        return [(cid, now - first[cid]) for cid in sorted(found) if now - first[cid] >= lag]

    def _pods(self, since: float) -> list[str]:
        """Pods made before since (monotonic) run; the deleted go; no container restarts. Also notes
        the containers pods have (_known) and those of running pods (_expected)."""
        reasons = []
        pods = self.load.look()
        now = time.monotonic()
        self._known = {st.container_id.split("://", 1)[-1]: f"{name}/{st.name}" for name, pod in pods.items()
                       for st in statuses(pod, init=True) if st.container_id}
        self._expected = {cid for pod in pods.values() if pod.metadata.deletion_timestamp is None
                          for cid in container_ids(pod, init=True).values()}
        for rec in list(self.load.pods.values()):
            pod = pods.get(rec.name)
            if rec.deleted:
                if pod is not None and now - rec.deleted > 120:
                    reasons.append(f"pod {rec.name} deleted {now - rec.deleted:.0f} s ago is still there")
                continue
            if pod is None or pod.status.phase == "Failed":
                self._lose(rec.name, f"pod {rec.name} {'is gone' if pod is None else 'failed'}: "
                                     f"{pod.status.reason if pod is not None else ''}")
                continue
            if running(pod, len(rec.parts)):
                rec.seen = now
            elif rec.claim and not pod.spec.node_name:  # kube-scheduler's to place (the load gives up on it)
                continue
            else:
                if rec.made < since:
                    reasons.append(f"pod {rec.name} not running")
                # Lost when it never ran within the bound, or stopped running that long (a pod a
                # reboot stops runs again after it: not lost while it comes back).
                down = now - max(rec.made, rec.seen)
                if down > self.timing.pod_bound:
                    self._lose(rec.name, f"pod {rec.name} does not run {down:.0f} s after it was made"
                                         if not rec.seen else f"pod {rec.name} has not run for {down:.0f} s")
            for st in statuses(pod, init=True):
                key = (rec.name, st.name)
                before = self._restarts.get(key, 0)
                if st.restart_count > before:
                    if self._excused:
                        self._excused_restarts.append(f"{rec.name}/{st.name}")
                    else:
                        self.violations.append(("restart", f"{rec.name}/{st.name} restarted ({st.restart_count})"))
                self._restarts[key] = st.restart_count
        return reasons

    def _lose(self, name: str, text: str) -> None:
        if name not in self._lost:
            self._lost.add(name)
            self.violations.append(("pod-lost", text))

    # -- the faults ------------------------------------------------------------------------------
    def _kill_resmgr(self, s: Strike) -> None:
        # A relay in kubelet's path that dies fails the calls in flight; kubelet makes a container
        # whose StartContainer failed anew (a restart). The NRI plugin is not in the path.
        self._excused = self.guest.mode == "relay"
        self._kill_daemon()

    def _kill_daemon(self) -> None:
        """SIGKILL of cri-resmgr, its time kept (in NRI mode the only cause a window opens on)."""
        self.kills.append(self.guest.now())
        self.guest.sh(f"systemctl kill -s KILL {self.guest.unit}")

    def _corrupt_state(self, s: Strike) -> None:
        # The state file cut in half (what a crash would leave of a write that was not atomic) and
        # cri-resmgr SIGKILLed at once: it must set the file aside and start from the runtime,
        # placements kept. A write of its own between the two heals the file first (noted).
        self._excused = self.guest.mode == "relay"
        aside = f"ls -t {STATE_DIR} | grep '^cache.broken-' | head -1"
        before = self.guest.sh(aside)
        self.kills.append(self.guest.now())
        state = f"{STATE_DIR}/cache"
        self.guest.sh(f"n=$(stat -c %s {state}); head -c $((n / 2)) {state} > {state}.cut && mv {state}.cut {state} "
                      f"&& systemctl kill -s KILL {self.guest.unit}")
        time.sleep(2)
        self.guest.wait_serving()
        # The relay's socket of the killed process may still be there: the state is read a while later.
        until = time.monotonic() + 60
        while not (moved := self.guest.sh(aside) != before) and time.monotonic() < until:
            time.sleep(3)
        s.notes["state file"] = "set aside" if moved else "healed by a write before the kill"

    def _kill_agent(self, s: Strike) -> None:
        self.guest.sh("systemctl kill -s KILL cri-resmgr-agent")

    def _restart_containerd(self, s: Strike) -> None:
        # A start in flight fails with containerd, and kubelet makes that container anew (noted).
        self._excused = True
        self.restarts.append(self.guest.now())
        self.guest.sh("systemctl restart containerd", timeout=180)

    def _restart_kubelet(self, s: Strike) -> None:
        # A start kubelet has in flight is cancelled with its connection, and containerd stops the
        # task it was starting; the new kubelet makes the container anew, as without cri-resmgr (noted).
        self._excused = True
        self.guest.sh("systemctl restart kubelet", timeout=180)

    def _api_away(self, s: Strike) -> None:
        self.load.paused.set()
        restarts = self.guest.inspect()["restarts"]
        try:
            self.control.apiserver.stop()
            away = time.monotonic()
            time.sleep(self.timing.api_away)
            back = time.monotonic()
            self.control.start_apiserver()
        finally:
            self.load.paused.clear()
        s.recovered = time.monotonic()
        s.notes["agent connections a minute while away"] = round(
            self.proxy.between(away, back) / ((back - away) / 60), 1)
        if self.guest.inspect()["restarts"] != restarts:
            self.violations.append(("restart", f"a daemon restarted while the API server was away: {restarts}"))

    def _disk_full(self, s: Strike) -> None:
        since = self.guest.now()
        self.guest.fill_state_fs()
        hold_until = time.monotonic() + self.timing.disk_full
        seen = dict.fromkeys(("log", "metric", "status", "probe", "node status"), False)
        info: dict = {}  # the last look at the node
        until = time.monotonic() + min(90.0, self.timing.disk_full - 5)
        while not all(seen.values()) and time.monotonic() < until:  # once a write has failed, all say so
            time.sleep(5)
            if not seen["status"]:
                status = self.guest.run("/usr/bin/cri-resmgr status", timeout=120)
                seen["status"] = status.code == 4 and "cannot write the state" in status.out
            if not seen["probe"]:
                probe = self.guest.run("/usr/bin/cri-resmgr-agent probe", timeout=120)
                seen["probe"] = probe.code != 0 and "cannot write the state" in probe.err
            seen["node status"] = seen["node status"] or bool(self.configs.node_status().get("problems"))
            # After the slow questions, not before: on the emulated node they take seconds, and the
            # last round must not miss what the first failed write (perhaps made meanwhile) logged.
            info = self.guest.inspect()
            seen["log"] = seen["log"] or "cannot write the state" in self.guest.journal(self.guest.unit, since)
            seen["metric"] = seen["metric"] or (info["failing"] or {}).get("cache") == 1.0
        s.notes["reported"] = seen
        if not seen["metric"]:  # what the endpoint said instead (None: no answer)
            s.notes["metric answer"] = info.get("failing")
        if not all(seen.values()):  # the evidence: how full it was, and whether writes still worked
            s.notes["free bytes"] = self.guest.run(f"df -B1 --output=avail {STATE_DIR} | tail -1").out.strip()
            s.notes["state written since the fill"] = info.get("state", {}).get("mtime", 0.0) > since
        for where, ok in seen.items():
            if not ok:
                self.violations.append(("disk-full-unreported", f"the full disk is not reported in the {where}"))
        restarts = self.guest.inspect()["restarts"][self.guest.unit]
        # A crash while the disk is full; in relay mode it fails the calls in flight, as _kill_resmgr's does.
        self._excused = self.guest.mode == "relay"
        self._kill_daemon()
        time.sleep(2)
        self.guest.wait_serving()
        time.sleep(max(0.0, hold_until - time.monotonic()))
        after = self.guest.inspect()["restarts"][self.guest.unit]
        s.notes["restarts while full"] = after - restarts
        if after - restarts != 1:
            self.violations.append(("crash-loop", f"{self.guest.unit} restarted {after - restarts} times while the "
                                                  "state directory was full (1 was the soak's kill)"))
        self.guest.free_state_fs()

    def _freeze_containerd(self, s: Strike) -> None:
        # The freeze outlasts kubelet's runtime request timeout on purpose: a start it cuts is made
        # anew by kubelet (a restart) as it would be without cri-resmgr; noted, not held against it.
        self._excused = True
        pid = self.guest.main_pid("containerd")
        began = self.guest.now()
        with self._lock:
            self.judge.stalled(began)
        self.guest.sh(f"kill -STOP {pid}")
        frozen = time.monotonic()
        try:
            time.sleep(5)
            s.notes.update(self._while_frozen())
            time.sleep(max(0.0, frozen + self.timing.freeze - time.monotonic()))
        finally:
            self.guest.sh(f"kill -CONT {pid}")
            thawed = self.guest.now()
            with self._lock:  # a change in flight could not reach the kernel meanwhile
                self.judge.stalled(began, thawed)
            self.events.append([thawed, "stalled", began])

    def _while_frozen(self) -> dict[str, Any]:
        """Calls through the relay time out by their deadline with a clear error; cri-resmgr itself answers."""
        notes: dict[str, Any] = {}
        if self.guest.mode == "relay":
            started = time.monotonic()
            res = self.guest.run(f"crictl --runtime-endpoint unix://{RELAY_SOCKET} --timeout 10s ps", timeout=60)
            took = time.monotonic() - started
            notes["relay call while frozen"] = f"exit {res.code} after {took:.1f} s: {res.err.strip()[-120:]}"
            if res.code == 0 or took > 10 + 8:  # as against containerd itself: no answer by the deadline
                self.violations.append(("frozen-runtime", f"a call through the relay while containerd was frozen: "
                                                          f"{notes['relay call while frozen']}"))
        started = time.monotonic()
        res = self.guest.run("/usr/bin/cri-resmgr status --timeout 5s >/dev/null", timeout=60)
        notes["status while frozen"] = f"exit {res.code} after {time.monotonic() - started:.1f} s"
        if res.code not in (0, 4):
            self.violations.append(("frozen-runtime",
                                    f"cri-resmgr status while containerd was frozen: {res.err[-200:]}"))
        return notes

    def _plant(self, s: Strike) -> None:
        """A violation made from outside cri-resmgr: a running container's memory nodes rewritten in
        its cgroup, and written again every read, for longer than the judge's grace; then put back.
        The judge must catch it (report: planted, apart from the product's violations)."""
        self.load.paused.set()  # no churn moves the container meanwhile
        try:
            # Not inside a configuration change's window: the judge may excuse a finding there until the
            # window ends, which the plant would not outlast. A change the node never follows ends
            # within switch_bound.
            until = time.monotonic() + self.judge.switch_bound + 30
            while time.monotonic() < until:
                with self._lock:
                    if self.judge.previous is None:
                        break
                self._note_applied()
                time.sleep(2)
            with self._lock:
                snap = dict(self.snapshot)
            ids = sorted(cid for cid, v in snap.items() if v[5] == "started" and cid in self._expected)
            if not ids:
                raise RuntimeError("no running container of the soak's pods to plant a violation in")
            cid = self.rng.choice(ids)
            wrong = wrong_mems(self.judge.machine, CPUSet.parse(snap[cid][1]))
            scope = self.guest.scope(cid)
            old = self.guest.set_mems(scope, wrong)
            first = self.guest.now()
            until = time.monotonic() + self.judge.grace + 3 * WHOLE_EVERY
            while time.monotonic() < until:
                time.sleep(2)
                self.guest.set_mems(scope, wrong)
            last = self.guest.now()
            self.guest.set_mems(scope, old)
        finally:
            self.load.paused.clear()
        self.plants.append(Plant("memory", cid, first, last, f"{cid[:12]} memory nodes {wrong} on CPUs "
                                                            f"{snap[cid][1]} ({self._known[cid]})"))
        s.notes["planted"] = self.plants[-1].text

    def _crowd(self, s: Strike) -> None:
        """Every exclusive CPU taken: Guaranteed pods of 2 CPUs made one after the other, past the
        churn's budget but within what kubelet admits, until cri-resmgr refuses one (kubelet reports
        CreateContainerError and tries again); then the others deleted, and the refused pod must run
        in the room they leave. It strikes while topology-aware or static is in force where the plan
        allows; under balloons and podpools Guaranteed pods share their pools, so kubelet's
        admission may end the crowd first: noted, not a violation."""
        self.load.paused.set()
        made: list[PodRecord] = []
        try:
            refused, why = None, ""
            end = time.monotonic() + CROWD_BOUND
            while time.monotonic() < end and refused is None:
                pods = self.load.look()
                refused, why = next(((r, w) for r in made if r.name in pods and (w := refusal(pods[r.name]))),
                                    (None, ""))
                if refused is None and all(r.running for r in made):
                    rec = self.load.make("g2", budgets=(ADMITTED, ADMITTED))
                    if rec is None:
                        break  # kubelet would admit no more
                    made.append(rec)
                if refused is None:
                    time.sleep(5.0)
            s.notes["pods made"] = len(made)
            for rec in made:  # room made: the churn's budgets hold again
                if rec is not refused:
                    self.load.delete(rec)
            if refused is None:
                s.notes["refused"] = f"none ({self.configs.expect().policy})"
                return
            s.notes["refused"] = f"{refused.name}: {why.split('; free:')[0][-160:]}"  # not the pools' listing
            room = time.monotonic()
            while time.monotonic() - room < CROWD_BOUND and not refused.running:
                time.sleep(5.0)
                self.load.look()
            if not refused.running:
                self.violations.append(("crowd", f"{refused.name}, refused for want of CPUs, not running "
                                                 f"{CROWD_BOUND:.0f} s after room was made"))
            else:
                s.notes["runs after room s"] = round(refused.running - room, 1)
        finally:
            self.load.paused.clear()

    def _upgrade(self, s: Strike) -> None:
        # The package rolled back to the previous release and upgraded again, pods running and the
        # churn going on: each install restarts the daemon and the agent onto the other code, and
        # must leave the node in its mode (relay or NRI plugin) with every placement kept.
        self._excused = self.guest.mode == "relay"  # a restarted relay fails the calls in flight
        versions, took = [], []
        for deb in (PREVIOUS, PACKAGE):
            agent = self.guest.main_pid("cri-resmgr-agent")
            self.upgrades.append(self.guest.now())
            began = time.monotonic()
            versions.append(self.guest.install_package(deb))
            took.append(round(time.monotonic() - began))
            running, should = self.guest.running(), self.guest.should_run()
            if running != should:
                self.violations.append(("upgrade", f"after installing {versions[-1]}: {running}, not {should}"))
            if self.guest.main_pid("cri-resmgr-agent") == agent:
                self.violations.append(("upgrade", f"after installing {versions[-1]}: the agent runs the code before"))
            if "unusable" in self.guest.journal(self.guest.unit, self.upgrades[-1]):  # each reads the other's state
                self.violations.append(("upgrade", f"after installing {versions[-1]}: the state file set aside"))
        s.notes["versions"] = " -> ".join(versions)
        s.notes["install s"] = took

    def _bad_config(self, s: Strike) -> None:
        good = self.configs.break_it()
        self._rejected = True
        broke = time.monotonic()
        try:
            while (why := self.configs.status_current(rejected=True)) and time.monotonic() - broke < 120:
                time.sleep(2)
            s.notes["rejection reported after s"] = round(time.monotonic() - broke, 1) if not why else None
            if why:
                self.violations.append(("bad-config", f"the rejection is not reported: {why}"))
        finally:
            self._rejected = False
            self.configs.write(self.configs.in_force, good)

    def _reboot(self, s: Strike) -> None:
        # The pods of before live through it, as on a node that reboots: the churn makes new ones
        # meanwhile (which must not take their CPUs) but neither deletes nor resizes them.
        self.load.spared = {p.name for p in self.load.live()}
        self._before_reboot = self._placements()
        self._switching_at_reboot = self._in_flight()
        s.notes["policy"] = self.configs.expect().policy  # how placements come back differs by policy
        self._pulling.clear()
        self._excused = True  # every container is made again; wait_whole takes the new counts
        self.restarts.append(self.guest.now())
        try:
            self.guest.vm.reboot()
        finally:
            self._pulling.set()
        s.recovered = time.monotonic()
        s.notes["boot s"] = round(self.guest.vm.boot_seconds, 1)

    def _placements(self) -> dict[tuple[str, str], str]:
        """Guaranteed containers' CPUs by pod and container name, from the last snapshot."""
        ids = {}
        for pod in self.control.core().list_namespaced_pod(NAMESPACE, label_selector="soak=yes").items:
            for name, cid in container_ids(pod, init=True).items():
                ids[cid] = (pod.metadata.name, name)
        with self._lock:
            snap = dict(self.snapshot)
        return {ids[cid]: v[1] for cid, v in snap.items() if cid in ids and v[5] == "started"
                and not v[0].startswith(("kubepods-burstable-", "kubepods-besteffort-"))}

    # -- the report ------------------------------------------------------------------------------
    def _nri_window(self) -> list[Violation]:
        """The judge's findings of containers containerd made without the plugin (NRI mode: a create
        the plugin died answering), set apart from the violations: the runtime's window, not a
        placement of cri-resmgr's (docs/nri.md)."""
        if self.guest.mode != "nri":
            return []
        try:
            journal = self.guest.nri_journal(self.started_wall)
        except Exception as err:  # a guest that does not answer: every finding stays a violation
            self.notes["nri window"] = f"journal not read: {type(err).__name__}: {err}"
            return []
        windows, uncaused = killed_windows(nri_windows(journal), self.kills)
        away, unstruck = restarted_windows(away_windows(journal), self.restarts)
        upgraded = upgrade_windows(journal, self.upgrades)
        self.notes["creates made without the plugin"] = len(windows)
        if away:
            self.notes["creates made before the plugin was back"] = len(away)
        if uncaused:  # the plugin died of itself, or the words mean something else: nothing excused
            self.notes["nri window without the soak's kill"] = [f"{a:.1f}-{b:.1f}" for a, b in uncaused]
        if unstruck:  # containerd started without the soak's doing: nothing excused
            self.notes["nri window without the soak's restart"] = [f"{a:.1f}-{b:.1f}" for a, b in unstruck]
        return self.judge.set_apart(windows + away + upgraded)

    def _refused(self) -> list[Violation]:
        """The judge's findings about containers left where they were while containerd stalled on
        their updates (its own journal says so), set apart from the violations: the runtime's doing."""
        try:
            journal = self.guest.update_journal(self.started_wall)
        except Exception as err:  # a guest that does not answer: every finding stays a violation
            self.notes["refused"] = f"journal not read: {type(err).__name__}: {err}"
            return []
        return self.judge.excuse_refused(refused_windows(journal))

    def report(self) -> dict[str, Any]:
        since = self.started_wall + self.timing.warmup  # the guest's clock follows the host's (its RTC)
        slopes = {}
        for name in ("cri-resmgr", "agent"):
            rss = [(r["t"], r["p"][name][0], r["p"][name][1] / 1024) for r in self.procs if r["p"].get(name)]
            fds = [(r["t"], r["p"][name][0], float(r["p"][name][2])) for r in self.procs if r["p"].get(name)]
            rs, n = slope(rss, 120.0, since)
            fs, _ = slope(fds, 120.0, since)
            slopes[name] = {"rss_mb_per_h": round(rs, 3), "rss_samples": n, "fds_per_h": round(fs, 3),
                            "rss_last_mb": rss[-1][2] if rss else 0.0, "fds_last": int(fds[-1][2]) if fds else 0,
                            # Each life's RSS (guest time, MB): a step (a policy first loaded) reads
                            # apart from a steady climb (a leak).
                            "rss_by_life": {str(pid): [[round(t), round(v, 1)] for t, q, v in rss if q == pid]
                                            for pid in dict.fromkeys(q for _, q, _ in rss)}}
        self.judge.finish()
        window = self._nri_window()
        refused = self._refused()
        self.judge.violations, planted = judge_plants(self.plants, self.judge.violations)
        self.violations += [("plant-missed", p) for p in planted if p.startswith("MISSED")]

        def when(v: Violation) -> str:
            """When (the guest's clock, as its journals have it) and for how long, to find in the journals."""
            into = max(0, int(v.first - self.started_wall))  # as the soak's own lines count time
            return (f"{time.strftime('%H:%M:%S', time.gmtime(v.first))} UTC ({into // 60:02d}:{into % 60:02d} "
                    f"into the run) for {v.last - v.first:.0f} s: {v.text}")

        judged = [(v.kind, when(v)) for v in self.judge.violations]
        said = self._said(self.judge.violations)
        self.evidence += self._lines_of(self.judge.violations)
        counts: dict[str, int] = {}
        for kind, _ in judged + self.violations:
            counts[kind] = counts.get(kind, 0) + 1
        return {
            "mode": self.settings.mode, "seed": self.settings.seed, "policy": self.settings.policy,
            "reboot": self.settings.reboot, "again": again(self.settings),
            "duration_s": round(time.monotonic() - self.started),
            "pods": {"made": self.load.made, "deleted": self.load.deleted, "resized": self.load.resized,
                     "api_errors": len(self.load.errors),
                     "claiming": sum(1 for p in self.load.pods.values() if p.claim),
                     "claiming_ran": sum(1 for p in self.load.pods.values() if p.claim and p.running),
                     "claiming_unplaced": self.load.unplaced},
            "config_changes": [what for _, what in self.configs.log],
            "config_switch_s": [(to, round(t, 1)) for to, t in self.judge.switches],
            "faults": fault_table(self.strikes),
            "strikes": [{"fault": s.kind, "to_whole_s": None if s.to_whole is None else round(s.to_whole, 1),
                         **s.notes} for s in self.strikes],
            "violations": counts, "violation_examples": [f"{k}: {t}" for k, t in (judged + self.violations)[:20]],
            "nri_window": [f"{v.kind}: {when(v)}" for v in window],
            "refused": [f"{v.kind}: {when(v)}" for v in refused], "planted": planted, "daemon_said": said,
            "evidence": self.evidence,
            "snapshots": self.judge.seen, "slopes": slopes, "state_max_bytes": self.state_max,
            "judge_events": self.events,  # the configuration changes as the judge had them (to replay a run)
            "notes": {**self.notes, **({"runtime leftovers": sorted(self.leftovers)} if self.leftovers else {})},
        }

    def _lines_about(self, names: list[str], since: float, until: float | None = None) -> list[str]:
        """The journals' lines naming names: for a violation of a step that never ended, or one the
        judge found (INFO logs name the containers a move waits on, containerd each update)."""
        try:
            return [f"({', '.join(names)})"] + self.guest.lines_about(names, since, until)
        except Exception as err:  # the node busy: the violation still counts
            return [f"(the journals could not be read: {type(err).__name__}: {str(err)[:200]})"]

    def _lines_of(self, violations: list[Violation], most: int = 3) -> list[str]:
        """The journals' lines naming the containers of the first few violations, from SAID_BEFORE
        before each to its end."""
        lines: list[str] = []
        seen: set[tuple[str, ...]] = set()
        for v in violations:
            if len(seen) >= most:
                break
            if not v.ids or v.ids in seen:
                continue
            seen.add(v.ids)
            lines += self._lines_about([i[:12] for i in v.ids], v.first - SAID_BEFORE, v.last + 5)
        return lines

    def _said(self, violations: list[Violation]) -> list[str]:
        """What cri-resmgr warned of from SAID_BEFORE before the first violation to the end of the
        last (a CI run's journals are not kept: these lines are its evidence)."""
        if not violations:
            return []
        first, last = min(v.first for v in violations), max(v.last for v in violations)
        try:
            return self.guest.warnings(self.guest.unit, first - SAID_BEFORE, last + 5)
        except Exception as err:  # the node gone with the run: the figures still count
            return [f"(the journal could not be read: {type(err).__name__}: {str(err)[:200]})"]


def disagree(placed: dict[str, list], snapshot: dict[str, list[str]]) -> dict[str, str]:
    """Started containers whose CPUs or memory nodes in the kernel are not what cri-resmgr's state
    file says it gave them (moves still in flight aside), with what each side says."""
    out = {}
    for cid, v in snapshot.items():
        if v[5] != "started" or cid not in placed or placed[cid][2]:
            continue
        cpus, mems, _ = placed[cid]
        if (cpus and CPUSet.parse(cpus) != CPUSet.parse_or_empty(v[1])) or \
                (mems and CPUSet.parse(mems) != CPUSet.parse_or_empty(v[2])):
            out[cid] = f"CPUs {cpus or '-'} memory {mems or '-'}, the kernel CPUs {v[1]} memory {v[2]}"
    return out


@dataclass
class Plant:
    """A violation the soak made itself, and when (the guest's clock)."""

    kind: str
    cid: str
    first: float
    last: float
    text: str

    def catches(self, v: Violation) -> bool:
        return v.kind == self.kind and self.cid in v.ids and self.first - 3 <= v.first <= self.last


def wrong_mems(machine: Machine, cpus: CPUSet) -> str:
    """Memory nodes a container on cpus must not have: a node none of them is on (or node 0 alone
    where they span every node)."""
    own = machine.nodes_of(cpus)
    other = [n for n in range(len(machine.node_cpus)) if n not in own]
    return str(other[0]) if other else "0"


def judge_plants(plants: list[Plant], violations: list[Violation]) -> tuple[list[Violation], list[str]]:
    """The violations less those the plants made, and each plant as caught or missed."""
    kept, told = list(violations), []
    for p in plants:
        caught = [v for v in kept if p.catches(v)]
        kept = [v for v in kept if v not in caught]
        told.append(f"{'caught' if caught else 'MISSED'}: {p.kind}: {p.text}")
    return kept, told


# -- a soak on a booted node ---------------------------------------------------------------------
SHORT = 20 * 60  # below this, the short form
CLAIMING_POLICIES = ("topology-aware", "static")  # the policies offering the NUMA-node devices claims take
CLAIMS_GONE = 120.0  # seconds for kubelet to unprepare the claims of pods deleted
AGENT_OPTIONS = "--export-topology on --export-devices on --status-interval 5 --resync-interval 30"
DAEMON_OPTIONS = f"--dra-driver {DRIVER}"  # kubelet's DRA driver of CPUs, as the chart with dra.enabled runs it
# The claims' controller; the node lifecycle's, which lifts the not-ready taint kubelet registers
# the node with (else kube-scheduler places nothing there) and taints it while it is not ready.
DRA_CONTROLLERS = "resourceclaim-controller,node-lifecycle-controller,root-ca-certificate-publisher-controller"


def killed_windows(windows: list[tuple[float, float]], kills: list[float],
                   within: float = 30.0) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The NRI windows that opened within `within` s of a SIGKILL of the soak's (the create it cut),
    and the others, which excuse nothing."""
    ours = [w for w in windows if any(k - 2.0 <= w[0] <= k + within for k in kills)]
    return ours, [w for w in windows if w not in ours]


def restarted_windows(windows: list[tuple[float, float, float]], restarts: list[float], within: float = 300.0
                      ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The windows of away_windows whose containerd started within `within` s after the soak restarted
    it or rebooted the node (a boot takes minutes on a starved emulated node), and the others, which
    excuse nothing; each as (first create, synchronization)."""
    ours = [(a, b) for started, a, b in windows if any(r - 2.0 <= started <= r + within for r in restarts)]
    return ours, [(a, b) for _, a, b in windows if (a, b) not in ours]


def settings_for(seconds: float, mode: str, seed: int, reboot: bool | None, daemon_options: str = "",
                 policy: str = "topology-aware") -> Settings:
    if seconds >= SHORT:
        return Settings(seconds, mode, seed, reboot=True if reboot is None else reboot, daemon_options=daemon_options,
                        policy=policy)
    # The daemon finds a full disk within 10 s, but on the emulated node each round's status and
    # probe take seconds: 60 s leaves time to see it reported everywhere.
    short = Timing(api_away=30, disk_full=60, runtime_timeout=60, freeze=75, config_every=60, warmup=30,
                   whole_within=300, pod_bound=300)
    return Settings(seconds, mode, seed, per_kind=1, reboot=bool(reboot), timing=short,
                    daemon_options=daemon_options, policy=policy)


def kubelet_settings(timing: Timing) -> dict[str, object]:
    """kubelet as production runs it (the tests' quick resyncs would cost an emulated node dearly)."""
    return {"runtimeRequestTimeout": f"{int(timing.runtime_timeout)}s", "syncFrequency": "1m"}


def soak_on(vm: Vm, control: ControlPlane, proxy: CountingProxy, settings: Settings) -> dict:
    """One soak on a booted node (installs the package there first). kube-scheduler allocates the
    load's DRA claims, the controller manager's claim controller makes them from their templates and
    deletes them with their pods."""
    install_agent_rbac(control, dra=True)
    install_crds(control)
    control.start_controllers(DRA_CONTROLLERS)
    custom = CustomObjectsApi(control.api_client())
    for template in claim_templates():
        try:
            custom.create_namespaced_custom_object(*TEMPLATES, template)
        except ApiException as err:
            if err.status != 409:
                raise
    guest = Guest(vm, settings.mode)
    guest.install(control, cfg.FALLBACK, kubelet_settings(settings.timing), AGENT_OPTIONS,
                  f"{DAEMON_OPTIONS} {settings.daemon_options}".strip())
    try:
        return Soak(guest, control, proxy, vm.shape, settings).run()
    finally:
        if guest.kubelet is not None:
            guest.kubelet.stop()
        guest.uninstall()
        control.stop_controllers()
