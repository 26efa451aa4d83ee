"""The soak's load: pods of a chosen kind within its budgets, and the Guaranteed ones counted."""

from __future__ import annotations

import random
from types import SimpleNamespace

from harness.soak.load import Load


class Core:
    def __init__(self) -> None:
        self.made: list[str] = []

        self.bodies: list[dict] = []
        self.resized: list[tuple[str, dict]] = []

    def create_namespaced_pod(self, namespace: str, body: dict) -> SimpleNamespace:
        self.made.append(body["metadata"]["name"])
        self.bodies.append(body)
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


def test_half_the_shared_pods_ask_for_the_pod_pool_and_no_guaranteed_one_does():
    from harness.soak.load import PODPOOL_ANNOTATION

    core = Core()
    load = Load(core, "node", random.Random(3))
    for i in range(40):
        load.make("be" if i % 2 else "g1")
        load.pods.clear()  # no budget in the way
    pooled = [b["metadata"]["name"].split("-")[0] for b in core.bodies if b["metadata"]["annotations"]]
    assert set(pooled) == {"be"} and 5 <= len(pooled) <= 15
    assert all(b["metadata"]["annotations"] == {PODPOOL_ANNOTATION: "soak"} for b in core.bodies
               if b["metadata"]["annotations"])


def test_a_two_cpu_guaranteed_pod_is_resized_down_to_one():
    core = Core()
    core.patch_namespaced_pod_resize = lambda name, ns, body: core.resized.append((name, body))
    load = Load(core, "node", random.Random(1))
    load.make("g2")
    load.pods["g2-0"].running = 1.0
    load.resize()
    assert core.resized == [("g2-0", {"spec": {"containers": [{"name": "c0", "resources": {
        "requests": {"cpu": "1000m", "memory": "32Mi"}, "limits": {"cpu": "1000m", "memory": "32Mi"}}}]}})]


def test_init_containers_and_sidecars_are_made_and_a_running_sidecar_counts_as_the_pods():
    from harness.kube import container_ids

    core = Core()
    load = Load(core, "node", random.Random(1))
    load.make("gi")
    load.make("si")
    gi, si = (b["spec"]["initContainers"][0] for b in core.bodies)
    assert "restartPolicy" not in gi and gi["resources"]["limits"] == {"cpu": "1000m", "memory": "32Mi"}
    assert si["restartPolicy"] == "Always"

    def st(name: str, cid: str, running: bool) -> SimpleNamespace:
        return SimpleNamespace(name=name, container_id=f"containerd://{cid}",
                               state=SimpleNamespace(running=SimpleNamespace() if running else None))

    pod = SimpleNamespace(status=SimpleNamespace(init_container_statuses=[st("init", "s1", True)],
                                                 container_statuses=[st("c0", "m1", True)]))
    assert container_ids(pod) == {"c0": "m1"}
    assert container_ids(pod, init=True) == {"init": "s1", "c0": "m1"}


def test_pods_of_a_claim_are_made_only_while_the_policy_offers_devices_and_go_through_the_scheduler():
    from harness.soak.load import CLAIM_CPUS, template_name

    core = Churn()
    load = Load(core, "node", random.Random(5))
    for _ in range(60):
        load.make()
        load.pods.clear()
    assert not any(name.startswith("dc-") for name in core.made)
    load.claiming.set()
    for _ in range(60):
        load.make()
        load.pods.clear()
    claiming = [b for b in core.bodies if b["metadata"]["name"].startswith("dc-")]
    assert claiming
    spec = claiming[0]["spec"]
    assert "nodeName" not in spec and spec["nodeSelector"] == {"kubernetes.io/hostname": "node"}
    assert spec["resourceClaims"][0]["resourceClaimTemplateName"] in {template_name(n) for n in CLAIM_CPUS}
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "cpus"}]
    # The judge learns each one's claim by its pod's UID; its CPUs count against the exclusive budget.
    load.pods.clear()
    rec = load.make("dc")
    assert rec is not None and load.claimed[rec.uid] == rec.claim
    assert load._budget()[0] == rec.claim * 1000


def test_a_pod_of_a_claim_the_scheduler_finds_no_room_for_is_given_up_and_claims_go_before_a_switch():
    from harness.soak import load as loadmod

    core = Churn()
    load = Load(core, "node", random.Random(5))
    load.claiming.set()
    waiting, placed = load.make("dc"), load.make("dc")
    assert waiting is not None and placed is not None
    waiting.made -= loadmod.UNPLACED + 1

    def pod(name: str, node: str) -> SimpleNamespace:
        return SimpleNamespace(metadata=SimpleNamespace(name=name), spec=SimpleNamespace(node_name=node),
                               status=SimpleNamespace(phase="Pending", container_statuses=[]))

    core.list_namespaced_pod = lambda ns, **kw: SimpleNamespace(  # type: ignore[method-assign]
        items=[pod(waiting.name, ""), pod(placed.name, "node")])
    load.look()
    assert core.deleted == [waiting.name] and load.unplaced == 1
    assert load.drop_claims() == [placed] and core.deleted == [waiting.name, placed.name]
