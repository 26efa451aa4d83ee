"""The soak's load: pods of a chosen kind within its budgets, and the Guaranteed ones counted."""

from __future__ import annotations

import random
from types import SimpleNamespace

from harness.soak.load import Load


class Core:
    def __init__(self) -> None:
        self.made: list[str] = []

    def create_namespaced_pod(self, namespace: str, body: dict) -> SimpleNamespace:
        self.made.append(body["metadata"]["name"])
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-{len(self.made)}"))


def test_pods_of_a_chosen_kind_are_made_within_the_budget_and_counted():
    load = Load(Core(), "node", random.Random(1))
    load.make("be")
    assert load.guaranteed() == (0, 0)
    for _ in range(10):
        load.make("g2")
    assert load.guaranteed() == (4, 0)  # 8 CPUs is what Guaranteed pods may hold at once
    load.pods["g2-1"].running = 1.0
    assert load.guaranteed() == (4, 1)
