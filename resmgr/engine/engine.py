"""The engine: owns pod and container state, asks the policy, applies decisions.

It speaks the model only (resmgr.model); each front end translates its protocol. A
lifecycle call that needs a decision is planned under the engine lock, the front end
makes the runtime call without it, then the plan is committed or aborted under it, so
calls for different pods run in parallel. Calls that need no decision take the runtime
call as a coroutine function and do the same around it.

What a container holds is given back only once the runtime confirms it is gone: a stop,
remove or create whose runtime call failed or was cancelled may or may not have happened,
so its grant stays until reconciliation (reconcile.py) has asked the runtime.

Engine owns the state (state.py), the reconciler, and one object per step, each in its own
module and each given the state (and the reconciler, where a step waits for it): create.py (pods
and containers made), start.py (starts held back until moved containers are off the CPUs),
update.py (updates and resizes), stop.py (stops, removals, runtime events), claims.py (DRA claims
prepared and unprepared). Callers name the part: `engine.creating.plan_create(...)`,
`engine.state.containers`.
"""

from __future__ import annotations

from resmgr.controllers import Controllers
from resmgr.controllers.cgroups import Cpusets
from resmgr.engine.claims import Claims
from resmgr.engine.create import Create
from resmgr.engine.reconcile import Reconciler
from resmgr.engine.start import Start
from resmgr.engine.state import EngineState, Hints, Runtime
from resmgr.engine.stop import Stop
from resmgr.engine.store import StateStore
from resmgr.engine.update import Update
from resmgr.policies.base import Policy


class Engine:
    """What the front ends call: the state, its reconciler, and every lifecycle step."""

    def __init__(self, policy: Policy, store: StateStore, runtime: Runtime, controllers: Controllers | None = None,
                 cpusets: Cpusets | None = None, gated: bool = False, device_hints: Hints | None = None,
                 write_behind: bool = False) -> None:
        """See EngineState for the arguments."""
        self.state = EngineState(policy, store, runtime, controllers, cpusets, gated, device_hints,
                                 write_behind)
        self.reconciler = Reconciler(self.state)
        self.creating = Create(self.state, self.reconciler)
        self.starting = Start(self.state, self.reconciler)
        self.updating = Update(self.state)
        self.stopping = Stop(self.state)
        self.claiming = Claims(self.state)

    @property
    def policy(self) -> Policy:
        """The policy in force, for what reads it (its name, what it describes, the CPU classes
        and interrupts it wants); a switch replaces it (EngineState.switch_policy)."""
        return self.state.policy

    async def reconcile(self, limits: bool = False) -> None:
        """One reconciliation round now (limits: see Reconciler.reconcile)."""
        await self.reconciler.reconcile(limits)

    async def run_reconciler(self, interval: float) -> None:
        """Reconcile every interval (0: only when woken), and retry a failed round with backoff."""
        await self.reconciler.run(interval)
