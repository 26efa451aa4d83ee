"""The layering rules of docs/architecture.md, checked by reading every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

FRONT_ENDS = ("resmgr.frontends", "resmgr.app", "harness")
# The generated protocol modules (resmgr.generated.schemas holds schema validators, not a protocol).
GENERATED = tuple(f"resmgr.generated.{p}" for p in ("agent", "config", "cri", "dra", "hooks", "nri",
                                                     "pluginregistration", "ttrpc"))
PROTOCOLS = GENERATED + ("grpc", "grpclib", "google.protobuf")
# Modules that reach the node or the network: sockets, processes, sysfs, files, the event loop.
IO = ("asyncio", "socket", "subprocess", "os", "pathlib", "shutil", "resmgr.topology.sysfs", "resmgr.topology.hints",
      "resmgr.topology.generate", "resmgr.engine", "resmgr.config", "resmgr.log")

# Engine is made of its steps (engine.py); each works on the state (state.py).
ENGINE_STEPS = ("resmgr.engine.engine", "resmgr.engine.create", "resmgr.engine.start", "resmgr.engine.update",
                "resmgr.engine.stop", "resmgr.engine.claims")

RULES = [
    # (modules under, must not import, why)
    ("resmgr/policies", FRONT_ENDS + PROTOCOLS + IO + ("resmgr.controllers", "resmgr.agent", "resmgr.metrics",
                                                       "resmgr.view", "resmgr.telemetry"),
     "policies are pure: no front end, controller, agent, metrics or I/O"),
    ("resmgr/metrics.py", FRONT_ENDS + PROTOCOLS + ("resmgr.policies", "resmgr.engine", "resmgr.controllers",
                                                    "resmgr.config", "resmgr.view", "resmgr.hooks"),
     "metrics are recorded by every layer, so they depend on none"),
    ("resmgr/telemetry.py", FRONT_ENDS + PROTOCOLS + ("resmgr.policies", "resmgr.engine", "resmgr.controllers",
                                                      "resmgr.config", "resmgr.view", "resmgr.hooks", "resmgr.metrics"),
     "traces are made by every layer, so telemetry depends on none (the registry it exports is handed to it)"),
    ("resmgr/view", FRONT_ENDS + PROTOCOLS + ("resmgr.engine", "resmgr.controllers", "resmgr.config"),
     "the view draws the state document it is given; it neither reaches into the engine nor speaks CRI"),
    ("resmgr/webhook", FRONT_ENDS + PROTOCOLS + ("resmgr.policies", "resmgr.engine", "resmgr.controllers",
                                                 "resmgr.config", "resmgr.view", "resmgr.hooks", "resmgr.topology"),
     "the webhook runs in the cluster, apart from the node daemon: it shares only the annotation's format"),
    ("resmgr/engine", FRONT_ENDS + PROTOCOLS, "the engine speaks the model, not a protocol"),
    ("resmgr/engine/state.py", ENGINE_STEPS + ("resmgr.engine.reconcile", "resmgr.engine.calls"),
     "the engine's state is what its steps and reconciliation share; it needs none of them"),
    ("resmgr/engine/reconcile.py", ENGINE_STEPS + ("resmgr.engine.calls",),
     "reconciliation repairs the state alone, whatever lifecycle call is under way"),
    *[(f"resmgr/engine/{step.rsplit('.', 1)[1]}.py", tuple(s for s in ENGINE_STEPS if s != step) + (
        "resmgr.engine.calls",), "each lifecycle step stands on the state alone, not on another step")
      for step in ENGINE_STEPS[1:]],
    ("resmgr/model.py", FRONT_ENDS + PROTOCOLS + ("resmgr.policies", "resmgr.engine"), "the model is plain data"),
    ("resmgr/requests.py", FRONT_ENDS + PROTOCOLS + ("resmgr.policies", "resmgr.engine", "resmgr.controllers"),
     "request parsing is shared by policies and controllers"),
    ("resmgr/cdi.py", ("resmgr",) + PROTOCOLS + IO,
     "CDI names are shared by the front ends that read them and the DRA plugin that makes them"),
    ("resmgr/topology", ("resmgr.policies", "resmgr.engine", "resmgr.controllers") + FRONT_ENDS,
     "topology knows nothing of what is placed on it"),
    ("resmgr/controllers", FRONT_ENDS + PROTOCOLS + ("resmgr.policies", "resmgr.engine"),
     "controllers turn class names into kernel settings, nothing more"),
    ("resmgr/hooks", FRONT_ENDS + ("resmgr.policies", "resmgr.engine", "resmgr.controllers"),
     "hook plugins speak the model and their own protocol, so every front end can call them"),
    ("resmgr/frontends/nri", ("resmgr.frontends.relay", "resmgr.frontends.cri", "resmgr.app", "harness"),
     "the NRI front end shares the engine, the model and the hooks with the relay, never the relay's code"),
    ("resmgr/frontends/cri", ("resmgr.frontends.nri",), "the CRI front end knows nothing of NRI"),
    ("resmgr/frontends/relay", ("resmgr.frontends.nri",), "the relay knows nothing of NRI"),
    ("resmgr/config", FRONT_ENDS + PROTOCOLS + ("resmgr.engine", "resmgr.hooks", "resmgr.controllers", "resmgr.control",
                                                "resmgr.view", "resmgr.sockets", "asyncio", "os", "subprocess"),
     "the configuration document is parsed and checked, never applied: it knows nothing of what applies it"),
    ("resmgr/control", ("resmgr.frontends.relay", "resmgr.frontends.cri", "resmgr.frontends.nri", "resmgr.app",
                        "harness"),
     "a configuration reaches the front end through its interface (resmgr/frontends), never a front end's code"),
    ("resmgr/agent", ("resmgr.engine", "resmgr.frontends", "resmgr.app", "resmgr.policies", "resmgr.controllers"),
     "the agent talks to the cluster and to cri-resmgr's config link only"),
    ("resmgr", ("harness", "tests", "benchmarks"), "the shipped package does not need the test harness"),
]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _modules(under: str) -> list[Path]:
    base = ROOT / under
    files = [base] if base.suffix == ".py" else sorted(base.rglob("*.py"))
    return [f for f in files if "generated" not in f.parts]


def _hits(name: str, banned: tuple[str, ...]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


@pytest.mark.parametrize("under, banned, why", RULES, ids=[r[0] for r in RULES])
def test_layering(under, banned, why):
    broken = []
    for path in _modules(under):
        for name in sorted(_imports(path)):
            if _hits(name, banned):
                broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not broken, f"{why}:\n" + "\n".join(broken)


def test_the_toolkit_imports_nothing_of_the_policies_built_on_it():
    broken = [f"{path.relative_to(ROOT)} imports {name}" for path in _modules("resmgr/policies/toolkit")
              for name in sorted(_imports(path))
              if _hits(name, ("resmgr.policies",)) and not _hits(name, ("resmgr.policies.toolkit",))]
    assert not broken, "the toolkit is what policies are built from; it must not import them:\n" + "\n".join(broken)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circles():
    """No module of the package imports, through others, back into itself (imports only for type
    checking included: a circle there is a circle in the design)."""
    modules = {_module_name(p): p for p in _modules("resmgr")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # "from a.b import c": the module a.b.c if there is one, else a.b itself
                targets.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                               for a in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    circles = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(" -> ".join(trail[trail.index(name):] + [name]))
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_rules_see_imports():
    assert "resmgr.model" in _imports(ROOT / "resmgr/engine/ledger.py")
    assert _hits("grpc.aio", PROTOCOLS) and not _hits("grpcio", PROTOCOLS)


def test_test_modules_share_helpers_through_the_support_package_only():
    broken = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted((ROOT / "tests").rglob("*.py"))
              for name in sorted(_imports(path))
              if _hits(name, ("tests",)) and not _hits(name, ("tests.support",)) and name != "tests"]
    assert not broken, "helpers used by several test modules belong in tests/support:\n" + "\n".join(broken)


def test_every_test_module_is_in_a_tier():
    tiers = ("unit", "integration", "cluster", "vm")
    loose = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("test_*.py"))
             if p.relative_to(ROOT / "tests").parts[0] not in tiers]
    assert not loose, "test modules belong under tests/unit/<layer>/, integration/, cluster/ or vm/:\n" + \
        "\n".join(loose)


def test_no_asyncio_wait_for():
    """asyncio.timeout, not wait_for: in Python 3.11 wait_for returns an inner result that completes as
    the task is cancelled and drops the cancellation, so a loop built on it can outlive its shutdown."""
    used = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "resmgr").rglob("*.py"))
            if "generated" not in path.parts
            for n, line in enumerate(path.read_text().splitlines(), 1) if "asyncio.wait_for(" in line]
    assert used == []


def test_every_generated_protocol_package_counts_as_a_protocol():
    packages = {p.name for p in (ROOT / "resmgr" / "generated").iterdir()
                if p.is_dir() and (p / "__init__.py").exists() or p.is_dir() and any(p.glob("*_pb2.py"))}
    assert {f"resmgr.generated.{p}" for p in packages - {"schemas"}} == set(GENERATED)


LEDGER_SETS = ("unallocated", "degraded", "deferred", "unsettled", "previous", "awaited", "vanished", "released_at")
CHANGES = ("add", "discard", "remove", "pop", "clear", "update", "setdefault", "popitem")


def test_only_the_ledger_changes_the_sets_it_keeps_beside_the_containers():
    """docs/architecture.md: the engine changes its bookkeeping through Ledger's methods (one door),
    never a set or map of the ledger's directly."""
    found = []
    for path in (ROOT / "resmgr").rglob("*.py"):
        if path == ROOT / "resmgr" / "engine" / "ledger.py" or "generated" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CHANGES:
                target = node.func.value
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                target = next((t.value for t in targets if isinstance(t, ast.Subscript)), None)
            if (isinstance(target, ast.Attribute) and target.attr in LEDGER_SETS
                    and isinstance(target.value, ast.Attribute) and target.value.attr == "ledger"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_class_is_over_400_lines():
    """Classes stay small: what grows past this is split into parts the class is composed of."""
    long = []
    for path in (ROOT / "resmgr").rglob("*.py"):
        if "generated" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > 400:
                long.append(f"{path.relative_to(ROOT)}: {node.name} {(node.end_lineno or 0) - node.lineno + 1}")
    assert long == []


def test_the_daemon_and_the_control_read_the_policy_through_the_engine():
    """app/ and control/ reach the policy in force as Engine.policy, never inside its state."""
    found = [f"{path.relative_to(ROOT)}:{n}" for d in ("app", "control") for path in (ROOT / "resmgr" / d).rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if "state.policy" in line]
    assert found == []


def test_only_the_containers_life_changes_their_state():
    """resmgr/engine/life.py: a container's state changes only by a step of its machine, which the
    ledger takes; nowhere else is Container.state assigned (a pod's state is not the machine's)."""
    found = []
    for path in (ROOT / "resmgr").rglob("*.py"):
        if path == ROOT / "resmgr" / "engine" / "life.py" or "generated" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if not (isinstance(t, ast.Attribute) and t.attr == "state"):
                        continue
                    if isinstance(t.value, ast.Name) and t.value.id == "self":
                        continue  # an object's own field named state (the engine's state, say)
                    value = ast.unparse(node.value)
                    if "PodState" in value or "CONTAINER_" in value:
                        continue  # a pod's state; the NRI front end's copy of the runtime's record
                    found.append(f"{path.relative_to(ROOT)}: {ast.unparse(node)}")
    assert found == [
        "resmgr/frontends/nri/plugin.py: c.state = ContainerState.PENDING",  # a new one, before the engine
        "resmgr/frontends/nri/runtime.py: copy.state = state",  # the runtime's record, not the engine's
    ]
