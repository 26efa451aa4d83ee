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


class Churn(Core):
    """The API as the churn uses it: pods listed running, deletes and resizes recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []
        self.resized: list[str] = []

    def list_namespaced_pod(self, namespace: str, **kw: object) -> SimpleNamespace:
        return SimpleNamespace(items=[])

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.deleted.append(name)

    def patch_namespaced_pod_resize(self, name: str, namespace: str, body: dict) -> None:
        self.resized.append(name)


def test_the_pods_spared_through_a_reboot_are_neither_deleted_nor_resized():
    core = Churn()
    load = Load(core, "node", random.Random(3))
    for kind in ("g1", "bl", "g1", "bl"):
        load.make(kind)
    for rec in load.pods.values():
        rec.running = 1.0
    load.spared = set(load.pods)
    load.look = lambda: {}  # type: ignore[method-assign]
    for _ in range(200):
        load.step()
    assert not set(core.deleted) & load.spared and not set(core.resized) & load.spared
    assert len(core.made) > 4  # the churn went on making pods
    load.spared = set()
    for _ in range(200):
        load.step()
    assert set(core.deleted) | set(core.resized)
