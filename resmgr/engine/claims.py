"""DRA claims kubelet prepares and unprepares: the policy holds a claim's CPUs from prepare to
unprepare, and the containers using it run on them. A prepared claim is on disk before the answer
goes back, as every grant is, so a restart keeps it."""

from __future__ import annotations

import logging

from resmgr.engine.state import EngineState
from resmgr.model import Claim, Decision
from resmgr.policies.base import PolicyError

log = logging.getLogger("cri-resmgr.engine")


class Claiming(EngineState):
    async def prepare_claims(self, claims: list[Claim]) -> dict[str, str]:
        """Prepare each claim; the errors of those refused, by UID (PolicyError's message)."""
        await self.until_reconciled()
        errors: dict[str, str] = {}
        decision = Decision()
        async with self.lock:
            for claim in claims:
                try:
                    updates = self.ledger.prepare(claim).updates
                except PolicyError as err:
                    errors[claim.uid] = str(err)
                    continue
                self.record(updates)
                decision.updates.update(updates)
                log.info("%s prepared: %s", claim.who, self.policy.describe_claim(claim.uid))
        await self._persist()
        await self.apply_updates(decision)
        return errors

    async def unprepare_claims(self, uids: list[str]) -> None:
        """Give the claims' CPUs back (a claim not prepared here is no error: kubelet may ask again)."""
        await self.until_reconciled()
        decision = Decision()
        async with self.lock:
            for uid in uids:
                claim = self.ledger.claims.get(uid)
                updates = self.ledger.unprepare(uid).updates
                self.record(updates)
                decision.updates.update(updates)
                if claim is not None:
                    log.info("%s unprepared", claim.who)
        await self._persist()
        await self.apply_updates(decision)

    async def _persist(self) -> None:
        """On disk before kubelet hears the answer, even where lifecycle answers write behind."""
        self.changes.bump()
        await self.store.save(self.snapshot)
