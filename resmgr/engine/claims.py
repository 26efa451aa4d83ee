"""DRA claims kubelet prepares and unprepares: the policy holds a claim's CPUs from prepare to
unprepare, and the containers using it run on them. A prepared claim is on disk before the answer
goes back, as every grant is, so a restart keeps it."""

from __future__ import annotations

import logging
from typing import Any

from resmgr.engine.state import EngineState
from resmgr.engine.store import StateNotWritten
from resmgr.model import Claim, Decision
from resmgr.policies.base import PolicyError

log = logging.getLogger("cri-resmgr.engine")


class Claims:
    def __init__(self, state: EngineState) -> None:
        self.state = state

    def prepared_claims(self) -> list[tuple[Claim, dict[str, Any] | None]]:
        """Every prepared claim, by UID, with what the policy holds for it (its CPUs, its users)."""
        prepared = self.state.policy.prepared_claims()
        return [(c, self.state.policy.describe_claim(uid)) for uid, c in sorted(prepared.items())]

    def devices(self) -> list[dict[str, Any]]:
        """The DRA devices the policy in force offers (Policy.devices)."""
        return self.state.policy.devices()

    def claim_held(self, uid: str) -> dict[str, Any] | None:
        """What the policy holds for a prepared claim (None: nothing)."""
        return self.state.policy.describe_claim(uid)

    def recover(self, claims: list[Claim]) -> list[Claim]:
        """Before the first reconciliation: hold again the claims prepared before that the state
        does not remember (its file lost or set aside; the driver's CDI specs still record them, and
        kubelet, which takes them as prepared, will not ask again), so that their containers are
        adopted onto them and nobody else onto their CPUs. Those held again."""
        lost = [c for c in claims if c.uid not in self.state.policy.prepared_claims()]
        self.state.ledger.reprepare(lost)
        held = self.state.policy.prepared_claims()
        again = [c for c in lost if c.uid in held]
        for c in again:
            log.warning("%s held again from its CDI spec, the state having lost it: %s", c.who,
                        self.state.policy.describe_claim(c.uid))
        return again

    async def prepare_claims(self, claims: list[Claim]) -> dict[str, str]:
        """Prepare each claim; the errors of those refused, by UID (PolicyError's message).

        Nothing but the state file remembers a prepared claim, so one that cannot be written is
        refused (kubelet asks again) rather than held in memory only."""
        await self.state.until_reconciled()
        if self.state.store.failing:
            return {c.uid: f"not prepared: {self.state.store.failing}" for c in claims}
        errors: dict[str, str] = {}
        decision = Decision()
        prepared: list[Claim] = []
        async with self.state.lock:
            for claim in claims:
                fresh = claim.uid not in self.state.policy.prepared_claims()  # else prepared before, and on disk
                try:
                    updates = self.state.ledger.prepare(claim).updates
                except PolicyError as err:
                    errors[claim.uid] = str(err)
                    continue
                self.state.record(updates)
                decision.updates.update(updates)
                if fresh:
                    prepared.append(claim)
        try:
            await self._persist()
        except StateNotWritten as err:
            async with self.state.lock:  # undone: what is pushed below is what is desired by then
                for claim in prepared:
                    undone = self.state.ledger.unprepare(claim.uid).updates
                    self.state.record(undone)
                    decision.updates.update(undone)
                    errors[claim.uid] = f"not prepared: {err}"
            await self.state.apply_updates(decision)
            return errors
        for claim in claims:
            if claim.uid not in errors:
                log.info("%s prepared: %s", claim.who, self.state.policy.describe_claim(claim.uid))
        await self.state.apply_updates(decision)
        return errors

    async def unprepare_claims(self, uids: list[str]) -> None:
        """Give the claims' CPUs back (a claim not prepared here is no error: kubelet may ask again)."""
        await self.state.until_reconciled()
        decision = Decision()
        async with self.state.lock:
            for uid in uids:
                claim = self.state.policy.prepared_claims().get(uid)
                updates = self.state.ledger.unprepare(uid).updates
                self.state.record(updates)
                decision.updates.update(updates)
                if claim is not None:
                    log.info("%s unprepared", claim.who)
        # Not strict: should the write fail and the daemon die, the claim comes back from the older
        # state, unused, and is collected as one kubelet will never unprepare.
        self.state.changes.bump()
        await self.state.store.save(self.state.snapshot)
        self.state.apply_soon(decision)  # CPUs given back: kubelet need not wait for them to be taken

    async def _persist(self) -> None:
        """On disk before kubelet hears the answer, even where lifecycle answers write behind
        (StateNotWritten if it cannot be)."""
        self.state.changes.bump()
        await self.state.after_resizes()  # what is written while one is under way is the state before it
        await self.state.store.save(self.state.snapshot, strict=True)
