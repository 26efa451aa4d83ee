"""Configuration: schemas, ConfigMap data, atomic apply, fuzzing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from resmgr.config import MODULES, ConfigError, from_map, validate
from resmgr.control.manager import ConfigManager, Rejected, Sources
from resmgr.engine import Engine
from resmgr.engine.store import StateStore
from resmgr.frontends.cri.runtime import CriRuntime
from tests.support.fakeruntime import FakeRuntime
from tests.support.world import machine


def test_configmap_keys_may_be_sections_or_dotted_paths():
    cfg = from_map({
        "policy": "Active: topology-aware\nReservedResources:\n  cpu: 750m\n",
        "policy.topology-aware": "PinMemory: false\n",
        "policy.topology-aware.ColocatePods": "true",
        "resource-manager.control": "rdt:\n  Mode: relaxed\n",
        "resource-manager.control.blockio": "Mode: disabled\n",
        "dump.Config": "full:.*",
    })
    pol = cfg.data["policy"]
    assert pol["Active"] == "topology-aware" and pol["ReservedResources"] == {"cpu": "750m"}
    assert pol["topology-aware"] == {"PinMemory": False, "ColocatePods": True}
    assert cfg.data["resource-manager.control"] == {"rdt": {"Mode": "relaxed"}, "blockio": {"Mode": "disabled"}}
    assert cfg.dump_rules == "full:.*"


@pytest.mark.parametrize("data, needle", [
    ({"policy": "Active: [x"}, "ConfigMap: policy: not valid YAML"),
    ({"polcy": "Active: none"}, "unknown section 'polcy'"),
    ({"policy.topology-aware": "PinCPU: maybe"}, "policy.topology-aware.PinCPU: 'maybe' is not of type 'boolean'"),
    ({"policy.topology-aware": "PinCPUs: true"}, "policy.topology-aware.PinCPUs: unknown key (known: "),
    ({"policy": "ReservedResources:\n  memory: 1G\n"}, "policy.ReservedResources.memory: unknown key"),
    ({"policy": "ReservedResources:\n  cpu: [1]\n"}, "policy.ReservedResources.cpu: [1] is not of type"),
    ({"blockio": "Classes:\n  slow:\n    - Weight: 5\n"}, "blockio.Classes.slow.0.Weight: 5 is less than"),
    ({"rdt": "options:\n  mode: Fast\n"}, "rdt.options.mode: 'Fast' is not one of"),
    ({"resource-manager.control.rdt": "Mode: sometimes"}, "resource-manager.control.rdt.Mode"),
    ({"instrumentation": "HTTPEndpoint: 8891"}, "instrumentation.HTTPEndpoint: 8891 is not of type"),
    ({"policy": "- a\n- b\n"}, "policy: expected a mapping"),
    ({"policy": "Active: fastest"}, "policy.Active: unknown policy 'fastest'"),
])
def test_configmap_errors_name_the_key_path(data, needle):
    with pytest.raises(ConfigError) as info:
        from_map(data)
    assert needle in str(info.value)


def test_every_module_has_a_schema():
    for module in MODULES:
        validate({module: {}})


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8)
keys = st.sampled_from([*MODULES, "policy.Active", "policy.static", "policy.topology-aware.PinCPU",
                        "dump.Config", "logger.Debug", "bogus", "policy.ReservedResources.cpu"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, yaml_values.map(yaml.safe_dump) | st.text(max_size=30), max_size=4))
def test_random_configmaps_are_accepted_or_rejected_never_crash(data):
    try:
        cfg = from_map(data)
    except ConfigError:
        return
    assert set(cfg.data) <= set(MODULES)


def _control(tmp_path, policy: str = "static") -> ConfigManager:
    from resmgr import policies

    topo = machine("sockets=1,cores=4,threads=1")
    store = StateStore(tmp_path)
    store.prepare()
    engine = Engine(policies.create(policy, {"Active": policy}, topo), store, CriRuntime(FakeRuntime()))
    return ConfigManager(Sources(state_dir=str(tmp_path)), validate({"policy": {"Active": policy}}), engine, topo)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(keys, yaml_values.map(yaml.safe_dump), max_size=4))
async def test_random_pushes_apply_whole_or_not_at_all(tmp_path_factory, data):
    control = _control(tmp_path_factory.mktemp("c"))
    before = (control.config.data, control.engine.state.policy, control.engine.state.policy.export_state())
    try:
        await control.push("n1", data)
    except Rejected as err:
        assert str(err) and control.last_error == str(err)
        assert (control.config.data, control.engine.state.policy, control.engine.state.policy.export_state()) == before
        assert not control.sources.pushed_store().path.exists()
        return
    assert control.config.data == from_map(data).data
    assert control.engine.state.policy.name == control.config.policy_name
    assert control.sources.pushed_store().path.exists()


async def test_a_policy_that_refuses_leaves_everything_as_it_was(tmp_path):
    control = _control(tmp_path, "topology-aware")
    with pytest.raises(Rejected, match="CPUs 9 are not available"):
        await control.push("n1", {"policy": "Active: topology-aware\nReservedResources:\n  cpu: cpuset:9\n"})
    assert control.config.policy_name == "topology-aware" and control.last_error
    with pytest.raises(Rejected, match="switching the policy from topology-aware to static is disabled"):
        control.disable_policy_switch = True
        await control.push("n1", {"policy": "Active: static\n"})


async def test_static_reconfiguration_re_allocates_under_the_new_settings(tmp_path):
    control = _control(tmp_path, "static")
    await control.push("n1", {"policy": "Active: static\nReservedResources:\n  cpu: cpuset:0\n"})
    assert control.engine.state.policy.reserved == control.engine.state.policy.reserved.parse("0")
    with pytest.raises(Rejected, match="CPUs 7 are not available"):
        await control.push("n1", {"policy": "Active: static\nReservedResources:\n  cpu: cpuset:7\n"})
    assert str(control.engine.state.policy.reserved) == "0"


async def test_the_agents_resync_of_the_configuration_in_force_changes_nothing(tmp_path, caplog):
    # The agent pushes the same configuration again at every resync (60 s by default): it was
    # applied anew each time, logged, counted as a new generation and written to disk.
    control = _control(tmp_path, "static")
    data = {"policy": "Active: static\nReservedResources:\n  cpu: cpuset:0\n"}
    await control.push("n1", data)
    generation, stored = control.generation, control.sources.pushed_store().path
    written = stored.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cri-resmgr.config"):
        await control.push("n1", dict(data))
    assert control.generation == generation and stored.stat().st_mtime_ns == written
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]
    await control.push("n2", dict(data))  # another node's name: the node's status names it
    assert control.generation == generation + 1
    with pytest.raises(Rejected):
        await control.push("n2", {"policy": "Active: static\nReservedResources:\n  cpu: cpuset:7\n"})
    await control.push("n2", dict(data))  # back to what is in force: the rejection is cleared
    assert not control.last_error and control.generation == generation + 2


def test_shipped_samples_are_valid():

    from resmgr.config import load_file

    root = Path(__file__).resolve().parents[3] / "config"
    load_file(str(root / "cri-resmgr.sample.yaml"))
    maps = [d for d in yaml.safe_load_all((root / "kubernetes" / "configmaps.yaml").read_text()) if d]
    assert {m["metadata"]["name"].split(".")[1] for m in maps} == {"default", "group", "node"}
    for m in maps:
        from_map(m["data"], m["metadata"]["name"])
    from resmgr.agent.agent import spec_data

    crs = [d for d in yaml.safe_load_all((root / "kubernetes" / "resourcemanagerconfigs.yaml").read_text()) if d]
    assert {c["metadata"]["name"].split(".")[0] for c in crs} == {"default", "group", "node"}
    for c in crs:
        from_map(spec_data(c["spec"]), c["metadata"]["name"])


@pytest.mark.parametrize("v2", [False, True])
def test_cgroup_cpu_values_are_resolved_at_load_under_the_cgroup_root(tmp_path, v2):
    from resmgr.control import cgroupcpus as cpus

    group = tmp_path / ("" if v2 else "cpuset") / "kube/reserved"
    group.mkdir(parents=True)
    (group / ("cpuset.cpus.effective" if v2 else "cpuset.cpus")).write_text("1-2\n")
    section = {"Active": "static", "ReservedResources": {"cpu": "cgroup:/kube/reserved"}}
    resolved = cpus.resolve(section, str(tmp_path))
    assert resolved["ReservedResources"]["cpu"] == "cpuset:1-2"
    assert section["ReservedResources"]["cpu"] == "cgroup:/kube/reserved"  # the configuration itself is kept
    topo = machine("sockets=1,cores=4,threads=1")
    from resmgr import policies

    assert str(policies.create("static", resolved, topo).reserved) == "1-2"
    with pytest.raises(ConfigError, match=r"policy.ReservedResources.cpu: cgroup:/missing: no cpuset"):
        cpus.resolve({"ReservedResources": {"cpu": "cgroup:/missing"}}, str(tmp_path))
    # nri-plugins' form: the cgroup's own directory, mount point included.
    assert cpus.resolve({"AvailableResources": {"cpu": str(group)}}, "/nowhere")["AvailableResources"] == \
        {"cpu": "cpuset:1-2"}
    # cri-resource-manager's form: a bare path below the cpuset hierarchy.
    assert cpus.resolve({"AvailableResources": {"cpu": "/kube/reserved"}}, str(tmp_path))["AvailableResources"] == \
        {"cpu": "cpuset:1-2"}
    with pytest.raises(ConfigError, match=r"policy.AvailableResources.cpu: .*/missing: not a cgroup directory.*"
                                          r"nor a cgroup below"):
        cpus.resolve({"AvailableResources": {"cpu": str(tmp_path / "missing")}}, str(tmp_path))


def test_cri_resource_managers_own_sections_are_left_out_with_a_warning(caplog):
    """Its test configurations carry CPU classes and klog settings: they load, the CPU classes as
    the cpu section, and the rest is named in a warning."""
    doc = {"policy": {"Active": "balloons"}, "logger": {"Debug": "policy", "Klog": {"skip_headers": True}},
           "cpu": {"classes": {"default": {"minFreq": 800, "maxFreq": 2800}}}}
    config = validate(doc, "cri-resmgr.cfg")
    assert config.policy_name == "balloons" and config.debug_sources == ["policy"]
    assert config.data["cpu"] == {"classes": {"default": {"minFreq": 800, "maxFreq": 2800}}}
    assert "cri-resmgr.cfg: logger.Klog left out" in caplog.text and "cpu left out" not in caplog.text
    assert doc["logger"]["Klog"] == {"skip_headers": True}  # the caller's document is not changed
    with pytest.raises(ConfigError, match="unknown section 'cpus'"):  # a typo is still one
        validate({"cpus": {}})
    migrating = {"policy": {"Active": "topology-aware"}, "resource-manager.control": {
        "page-migration": {"PageScanInterval": "5s", "MaxPageMoveCount": 1024}, "rdt": {"Mode": "relaxed"}}}
    config = validate(migrating, "pmem.cfg")
    assert config.policy_name == "topology-aware"
    assert "pmem.cfg: resource-manager.control.page-migration left out" in caplog.text


def test_a_misspelling_cri_resource_manager_ignores_is_left_out_and_others_still_refused(caplog):
    """Its balloons samples write PreferNewBalloon, which its loader ignores: it loads with a warning;
    another misspelt option is still an error."""
    types = [{"Name": "a", "preferNewBalloon": True}, {"Name": "b", "MinCPUs": 1}]
    config = validate({"policy": {"Active": "balloons", "balloons": {"BalloonTypes": types}}}, "sample.cfg")
    assert config.policy_name == "balloons"
    assert "sample.cfg: policy.balloons.BalloonTypes.0.preferNewBalloon left out" in caplog.text
    assert types[0] == {"Name": "a", "preferNewBalloon": True}
    with pytest.raises(ConfigError, match="PreferNewBalloonz"):
        validate({"policy": {"Active": "balloons", "balloons": {"BalloonTypes": [
            {"Name": "a", "PreferNewBalloonz": True}]}}})


def test_an_nri_plugins_policy_resource_is_a_configuration_wherever_one_is_taken(caplog):
    """validate() itself reads a BalloonsPolicy resource (files, pushes, simulate's config steps), and
    leaves nri-plugins' AllocationPriority misspelling out as its loader does."""
    doc = {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy", "metadata": {"name": "default"},
           "spec": {"reservedResources": {"cpu": "750m"}, "log": {"debug": ["policy"]},
                    "balloonTypes": [{"name": "t", "minCPUs": 2}]}}
    config = validate(doc, "pushed")
    assert config.policy_name == "balloons"
    assert "pushed: log left out" in caplog.text
    with pytest.raises(ConfigError, match="pushed: kind Nope"):
        validate({**doc, "kind": "Nope"}, "pushed")
    cfg = validate({"policy": {"Active": "balloons", "balloons": {"BalloonTypes": [
        {"Name": "two", "AllocationPriority": 0}]}}}, "e2e.cfg")
    assert cfg.policy_name == "balloons" and "BalloonTypes.0.AllocationPriority left out" in caplog.text


def test_nri_plugins_options_that_cannot_move_a_placement_are_left_out_with_a_warning(caplog):
    """A TopologyAwarePolicy or BalloonsPolicy nri-plugins accepts is never refused for its CPU
    priority or CPU classes: each is named in a warning. Scheduling classes are taken."""
    ta = {"apiVersion": "config.nri/v1alpha1", "kind": "TopologyAwarePolicy",
          "spec": {"reservedResources": {"cpu": "750m"}, "defaultCPUPriority": "high", "sharedPoolCPUClass": "slow",
                   "schedulingClasses": [{"name": "rt", "policy": "fifo", "priority": 10}]}}
    config = validate(ta, "ta")
    assert config.policy_name == "topology-aware"
    assert "ta: policy.topology-aware.defaultCPUPriority left out" in caplog.text
    assert config.data["policy"]["topology-aware"]["sharedPoolCPUClass"] == "slow"  # a pool's CPU class
    assert "schedulingClasses left out" not in caplog.text
    assert config.data["policy"]["topology-aware"]["schedulingClasses"] == [{"name": "rt", "policy": "fifo",
                                                                              "priority": 10}]
    b = {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
         "spec": {"reservedResources": {"cpu": "750m"}, "schedulingClasses": [{"name": "rt", "nice": -5}],
                  "balloonTypes": [{"name": "a", "schedulingClass": "rt"}]}}
    assert validate(b, "b").policy_name == "balloons"
    assert "schedulingClass left out" not in caplog.text
    with pytest.raises(ConfigError, match="defaultCPUPriorty"):  # a typo is still one
        validate({**ta, "spec": {"defaultCPUPriorty": "high"}}, "ta")


def test_a_key_that_is_not_a_string_is_refused_with_where_it_is():
    # YAML reads `~: x` as a null key and `1: x` as an integer one; the schemas' validators need strings.
    with pytest.raises(ConfigError, match=r"cpu\.None: a key must be a string"):
        from_map({"cpu": "~: ~\n"})
    with pytest.raises(ConfigError, match=r"policy\.ReservedResources\.1: a key must be a string"):
        from_map({"policy": "Active: topology-aware\nReservedResources:\n  1: 2\n"})
