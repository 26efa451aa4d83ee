"""Pure pieces: QoS parsing, dump rules, config validation, store, policy registry, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resmgr import policies
from resmgr.config import ConfigError, load_file, validate
from resmgr.engine import statefile
from resmgr.engine.store import StateStore
from resmgr.frontends.cri import convert
from resmgr.frontends.relay import dump
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import QOSClass, Resources, qos_class_from_cgroup_parent
from tests.support.helpers import ROOT, run_main


@pytest.mark.parametrize("parent,qos", [
    ("/kubepods/besteffort/pod123", QOSClass.BEST_EFFORT),
    ("/kubepods/burstable/pod123", QOSClass.BURSTABLE),
    ("/kubepods/pod123", QOSClass.GUARANTEED),
    ("kubepods-besteffort-pod123.slice", QOSClass.BEST_EFFORT),
    ("kubepods-burstable-pod123.slice", QOSClass.BURSTABLE),
    ("kubepods-pod123.slice", QOSClass.GUARANTEED),
    ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice", QOSClass.BURSTABLE),
    ("kubepods.slice/kubepods-pod1.slice", QOSClass.GUARANTEED),
    ("/custom-root/kubepods/burstable/pod1", QOSClass.BURSTABLE),
    ("", QOSClass.BEST_EFFORT),
    ("/system.slice/foo", QOSClass.BEST_EFFORT),
])
def test_qos_class_from_cgroup_parent(parent, qos):
    assert qos_class_from_cgroup_parent(parent) == qos


def test_qos_class_skips_cgroup_root():
    assert qos_class_from_cgroup_parent("/root/kubepods/pod1", cgroup_root="/root") == QOSClass.GUARANTEED


@given(st.builds(Resources, cpu_period=st.integers(0, 10**6), cpu_quota=st.integers(-1, 10**7),
                 cpu_shares=st.integers(0, 262144), memory_limit_in_bytes=st.integers(0, 2**40),
                 cpuset_cpus=st.sampled_from(["", "0", "0-3,8"]), cpuset_mems=st.sampled_from(["", "0,1"]),
                 hugepage_limits=st.dictionaries(st.sampled_from(["2MB", "1GB"]), st.integers(0, 2**30)),
                 unified=st.dictionaries(st.sampled_from(["memory.high", "io.weight"]), st.text(max_size=5))))
def test_resources_round_trip(res):
    assert convert.resources(convert.to_linux(res)) == res
    assert Resources.from_dict(json.loads(json.dumps(res.to_dict()))) == res


def test_resources_to_cri_keeps_existing_message():
    msg = cri.LinuxContainerResources(oom_score_adj=-997, cpu_shares=2)
    convert.to_linux(Resources(cpuset_cpus="1", oom_score_adj=-997), msg)
    assert msg.cpuset_cpus == "1" and msg.oom_score_adj == -997 and msg.cpu_shares == 0


def test_default_dump_rules():
    d = dump.Dumper(dump.DEFAULT_RULES)
    base = "/runtime.v1.RuntimeService/"
    assert d.level(base + "CreateContainer") == dump.Level.SHORT
    assert d.level(base + "RunPodSandbox") == dump.Level.SHORT
    assert d.level(base + "ListContainers") == dump.Level.OFF
    assert d.level("/runtime.v1.ImageService/RemoveImage") == dump.Level.OFF


def test_dump_rules_later_win_and_reset():
    d = dump.Dumper("full:.*,off:List.*,reset,short:Version")
    assert d.level("/a.B/Version") == dump.Level.SHORT
    assert d.level("/a.B/ListContainers") == dump.Level.OFF
    d = dump.Dumper("full:.*,off:List.*")
    assert d.level("/a.B/ListContainers") == dump.Level.OFF
    assert d.level("/a.B/Status") == dump.Level.FULL


@pytest.mark.parametrize("bad", ["loud:.*", "full", "full:(unclosed"])
def test_bad_dump_rules_are_rejected(bad):
    with pytest.raises(dump.RuleError):
        dump.parse_rules(bad)


def test_full_dump_is_readable(tmp_path):
    out = tmp_path / "dump"
    d = dump.Dumper("full:.*", str(out))
    req = cri.ContainerStatusRequest(container_id="abc")
    d.record("/runtime.v1.RuntimeService/ContainerStatus", "passthrough", 0.0,
             raw_request=req.SerializeToString(), error=("NOT_FOUND", "no such container"))
    d.close()
    text = out.read_text()
    assert "container_id: abc" in text and "code: NOT_FOUND" in text and "latency_ms" in text


def test_dump_file_is_private(tmp_path):
    fresh, old = tmp_path / "fresh", tmp_path / "old"
    old.write_text("earlier dumps\n")
    old.chmod(0o644)
    for path in (fresh, old):
        dump.Dumper("full:.*", str(path)).close()
        assert path.stat().st_mode & 0o777 == 0o600
    assert old.read_text() == "earlier dumps\n"  # appended to, not truncated


def test_config_defaults_and_sections():
    cfg = validate({"policy": {"Active": "null"}, "dump": {"Config": "full:.*"}, "logger": {"Debug": "engine,relay"}})
    assert cfg.policy_name == "none"
    assert cfg.dump_rules == "full:.*"
    assert cfg.debug_sources == ["engine", "relay"]
    assert validate({}).policy_name == "none"
    # Sections later modules own are accepted as they are.
    assert validate({"rdt": {"options": {"mode": "Disabled"}}}).data["rdt"]["options"]["mode"] == "Disabled"


@pytest.mark.parametrize("doc,needle", [
    ({"polcy": {}}, "unknown section 'polcy'"),
    ({"policy": {"Active": "fastest"}}, "policy.Active: unknown policy 'fastest'"),
    ({"policy": {"Actve": "none"}}, "policy.Actve: unknown key"),
    ({"policy": "none"}, "policy: expected a mapping"),
    ({"dump": {"Config": "loud:.*"}}, "dump.Config"),
    ({"logger": {"Debug": 3}}, "logger.Debug"),
    ([1, 2], "expected a mapping"),
])
def test_config_errors_name_the_key(doc, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        validate(doc, "cfg.yaml")


def test_config_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file .*missing.yaml"):
        load_file(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [unclosed")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_file(str(bad))


def test_store_atomic_write_and_permissions(tmp_path):
    store = StateStore(tmp_path)
    store.write({"pods": []})
    assert json.loads((tmp_path / "cache").read_text())["version"] == 1
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]
    os.chmod(tmp_path / "cache", 0o666)
    assert store.load() is None  # world-writable state is not trusted
    assert any(p.name.startswith("cache.broken-") for p in tmp_path.iterdir())


def test_only_the_newest_broken_state_files_are_kept(tmp_path):
    from resmgr.engine.store import KEEP_BROKEN

    for _ in range(KEEP_BROKEN + 4):
        (tmp_path / "cache").write_text("{not json")
        (tmp_path / "cache").chmod(0o600)
        assert StateStore(tmp_path).load() is None
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cache.broken-"))
    assert len(kept) == KEEP_BROKEN
    (tmp_path / "cache.broken-1").write_text("oldest")  # older than every kept one: goes next
    (tmp_path / "cache").write_text("{not json")
    (tmp_path / "cache").chmod(0o600)
    StateStore(tmp_path).load()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cache.broken-"))
    assert len(left) == KEEP_BROKEN and "cache.broken-1" not in left and kept[-1] in left


def test_store_sets_aside_versions_that_never_were_and_refuses_newer_ones(tmp_path):
    from resmgr.engine.store import StateTooNew

    (tmp_path / "cache").write_text(json.dumps({"version": 0}))
    (tmp_path / "cache").chmod(0o600)
    assert StateStore(tmp_path).load() is None
    (tmp_path / "cache").write_text(json.dumps({"version": 99}))
    (tmp_path / "cache").chmod(0o600)
    with pytest.raises(StateTooNew):
        StateStore(tmp_path).load()


@pytest.mark.parametrize("content", [
    '{"version":1,"policy":"static"}',
    '{"version":1,"pods":[{"id":"p"}],"containers":[]}',
    '{"version":1,"pods":[],"containers":[{"id":"c","pod_id":"p","name":"n","state":"running","attempt":"1"}]}',
    '{"version":1,"pods":[],"containers":[],"policy":{"name":"static","data":[]}}',
    '{"version":1,"pods":' + "[" * 100000 + "]" * 100000 + ',"containers":[]}',
    b"\xff\xfe\x00garbage",
])
def test_state_that_does_not_validate_is_moved_aside(tmp_path, content):
    path = tmp_path / "cache"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    path.chmod(0o600)
    assert StateStore(tmp_path).load(statefile.check) is None
    assert not path.exists() and any(p.name.startswith("cache.broken-") for p in tmp_path.iterdir())


def test_a_valid_state_loads(tmp_path):
    from resmgr.engine import Engine

    eng = Engine(policies.create("none"), StateStore(tmp_path), None)
    StateStore(tmp_path).write(eng.state.snapshot())
    assert StateStore(tmp_path).load(statefile.check)["policy"]["name"] == "none"


def test_registry_and_aliases():
    assert policies.canonical("null") == "none"
    assert policies.create("null").name == "none"
    with pytest.raises(KeyError, match="available: balloons, none, podpools, static, static-plus"):
        policies.canonical("nope")


def _cli(*args: str) -> subprocess.CompletedProcess:
    """cri-resmgr with args, for what it does before it starts (in this process: no interpreter to start)."""
    from resmgr.app.cli import main

    return run_main(main, *args)


def test_cli_list_policies():
    out = _cli("--list-policies")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0] == "Available policies:"
    assert "  * none: " in out.stdout and "alias: null" in out.stdout
    assert "  * static: " in out.stdout and "  * static-plus: " in out.stdout
    assert "  * topology-aware: " in out.stdout


def test_cli_print_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy:\n  Active: null\ndump:\n  Config: 'full:.*'\n")
    out = _cli("--force-config", str(cfg), "--print-config")
    assert out.returncode == 0
    assert f"forced config file {cfg}" in out.stdout
    assert "Active: none" in out.stdout and "full:.*" in out.stdout


def test_cli_bad_config_stops_startup(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy:\n  Active: fastest\n")
    out = _cli("--fallback-config", str(cfg), "--relay-socket", str(tmp_path / "s.sock"))
    assert out.returncode == 2
    assert str(cfg) in out.stderr and "fastest" in out.stderr
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("content, message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff", "is not UTF-8 text"),
    (b"", "is empty"),
    (b"# nothing but a comment\n", "is empty"),
    (b"policy: {Active: static", "is not valid YAML"),
])
@pytest.mark.parametrize("option", ["--force-config", "--fallback-config"])
def test_cli_unreadable_config_is_one_line_naming_the_file(tmp_path, content, message, option):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    out = _cli(option, str(cfg), "--relay-socket", str(tmp_path / "s.sock"), "--relay-dir", str(tmp_path / "st"))
    assert out.returncode == 2 and not (tmp_path / "s.sock").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(cfg) in lines[0] and message in lines[0], out.stderr


def test_cli_force_and_fallback_together_is_an_error(tmp_path):
    out = _cli("--force-config", "a", "--fallback-config", "b")
    assert out.returncode == 2 and "not allowed with" in out.stderr


def test_cli_help_explains_itself():
    out = _cli("--help")
    assert out.returncode == 0
    for flag in ("--relay-socket", "--runtime-socket", "--image-socket", "--relay-dir", "--dump",
                 "--dump-file", "--force-config", "--fallback-config", "--print-config", "--list-policies"):
        assert flag in out.stdout


def test_generated_protos_are_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import genproto
    finally:
        sys.path.pop(0)
    with tempfile.TemporaryDirectory() as tmp:
        for path in genproto.generate(Path(tmp)):
            committed = ROOT / path.relative_to(tmp)
            assert committed.read_text() == path.read_text(), \
                f"{committed} is stale: run python scripts/genproto.py"


def test_cli_policy_config_the_machine_cannot_meet(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy:\n  Active: static\n  ReservedResources:\n    cpu: cpuset:0,999\n")
    out = subprocess.run([sys.executable, "-m", "resmgr", "--force-config", str(cfg), "--relay-socket",
                          str(tmp_path / "s.sock"), "--relay-dir", str(tmp_path / "state"), "--runtime-socket",
                          str(tmp_path / "none.sock"), "--config-socket", str(tmp_path / "config.sock")],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 1
    assert str(cfg) in out.stderr and "policy.ReservedResources.cpu: CPUs 999 are not available" in out.stderr


def test_every_daemon_option_is_a_flag_and_the_defaults_hold():
    import dataclasses

    from resmgr.app.cli import build_parser
    from resmgr.app.options import Options
    from resmgr.options import from_args

    parser = build_parser()
    parsed = from_args(Options, parser.parse_args([]))
    assert parsed == Options()  # the parser's defaults are the table's
    for f in dataclasses.fields(Options):
        assert f.metadata["flags"] and f.metadata["help"], f.name
    flags = build_parser().parse_args(["--runtime-events", "off", "--hook-timeout", "500ms", "--nri",
                                       "--host-root", "/host", "--relay-dir", "/old/name", "--shutdown-grace", "2s"])
    got = from_args(Options, flags)
    assert (got.runtime_events, got.hook_timeout, got.nri, got.cgroup_root) == (False, 0.5, True,
                                                                                "/host/sys/fs/cgroup")
    assert (got.state_dir, got.shutdown_grace) == ("/old/name", 2.0)  # older names are kept
    with pytest.raises(SystemExit):  # two sources of configuration at once
        build_parser().parse_args(["--force-config", "a.yaml", "--fallback-config", "b.yaml"])


def test_classes_are_kept_by_controller_name_and_older_state_files_still_load():
    from resmgr.engine import statefile
    from resmgr.model import Container

    old = {"id": "c1", "pod_id": "p1", "name": "app", "state": "running", "rdt_class": "gold",
           "blockio_class": "slow"}
    statefile.check({"version": 1, "pods": [], "containers": [old]})
    c = Container.from_dict(old)
    assert c.classes == {"rdt": "gold", "blockio": "slow"}
    again = Container.from_dict(c.to_dict())
    assert again.classes == c.classes and "rdt_class" not in c.to_dict()


def test_every_place_that_names_the_version_names_the_same_one():
    """The package, --version of each program, the chart's version and appVersion (the image tag)."""
    import tomllib

    import yaml

    from resmgr import __version__
    from resmgr.agent.main import build_parser as agent_parser
    from resmgr.app.cli import build_parser as daemon_parser
    from resmgr.webhook.main import build_parser as webhook_parser

    root = Path(__file__).resolve().parents[3]
    assert tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"] == __version__
    chart = yaml.safe_load((root / "deployment/helm/cri-resmgr/Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["version"] == __version__.replace(".dev", "-dev.")  # SemVer: 0.3.0.dev0 is 0.3.0-dev.0
    for parser, prog in ((daemon_parser(), "cri-resmgr"), (agent_parser(), "cri-resmgr-agent"),
                         (webhook_parser(), "cri-resmgr-webhook")):
        with pytest.raises(SystemExit):
            parser.parse_args(["--version"])
        assert any(getattr(a, "version", None) == f"{prog} {__version__}" for a in parser._actions)


def test_the_probe_does_not_load_the_engine(tmp_path):
    """Probes run `cri-resmgr status --probe` every few seconds on every node: it must stay a short process."""
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "resmgr", "status", "--probe", "--config-socket",
                          str(tmp_path / "none.sock")], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot reach" in out.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in loaded if m.startswith(("resmgr.engine", "resmgr.policies", "resmgr.frontends",
                                                    "resmgr.view"))}


def _fresh(script: str) -> str:
    """What a fresh interpreter prints running script at the checkout's root."""
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _modules_after(script: str) -> set[str]:
    """The modules a fresh interpreter holds after running script at the checkout's root."""
    return set(_fresh(script + "\nimport sys\nprint(' '.join(sys.modules))").split())


def _packages(modules: set[str], *names: str) -> set[str]:
    return {m for m in modules if m.split(".")[0] in names}


def test_the_daemon_loads_the_http_endpoint_and_the_otlp_exporter_only_when_asked_for():
    """aiohttp and OpenTelemetry's SDK cost about 20 MB and a quarter of a second at start."""
    loaded = _modules_after("import resmgr.app.daemon")
    assert "resmgr.app.daemon" in loaded
    assert not {m for m in loaded if m.startswith(("aiohttp", "opentelemetry.sdk", "opentelemetry.exporter",
                                                    "resmgr.view.server"))}


def test_the_nri_plugin_loads_no_grpc():
    """gRPC's C core costs about 10 MB at rest: the config link is served by grpclib, and gRPC is
    loaded for hook plugins once one registers, for the relay's runtime client, DRA and OTLP."""
    loaded = _modules_after("import resmgr.app.launch, resmgr.app.daemon, resmgr.frontends.nri.frontend, "
                            "resmgr.hooks.runner, resmgr.control.link")
    assert _packages(loaded, "grpc") == set()


def test_the_nri_plugin_loads_neither_http2_nor_inotify_before_it_is_needed():
    """Loading the config link's HTTP/2 stack (grpclib, h2) takes about 20 ms: it is loaded once the
    runtime synchronized the plugin, not before; inotify (asyncinotify, ctypes) where a hook
    directory is watched."""
    loaded = _modules_after("import resmgr.app.launch, resmgr.app.daemon, resmgr.frontends.nri.frontend, "
                            "resmgr.frontends.nri.plugin, resmgr.hooks")
    assert _packages(loaded, "grpclib", "h2", "asyncinotify") == set()


def test_the_config_link_is_loaded_only_once_the_runtime_synchronized_the_plugin():
    """The link's wait comes before its HTTP/2 stack is loaded: loaded first, it held the event loop
    for about 20 ms before the plugin dialled the runtime."""
    loaded = _modules_after("import asyncio\n"
                            "from resmgr.app.daemon import Daemon\n"
                            "class Front:\n"
                            "    def serving(self):\n"
                            "        return 'not synchronized yet'\n"
                            "async def main():\n"
                            "    try:\n"
                            "        await asyncio.wait_for(Daemon._serve_link(object(), None, Front()), 0.2)\n"
                            "    except TimeoutError:\n"
                            "        pass\n"
                            "asyncio.run(main())")
    assert _packages(loaded, "grpclib", "h2") == set()


def test_the_config_link_loads_its_http2_stack_beside_the_event_loop_not_on_it():
    """The link loads at the latest LINK_WAIT after the start, synchronized or not; on a slow node the
    import of its HTTP/2 stack held the event loop for 1.7 s in the middle of the runtime's first
    Synchronize, which then missed containerd's 2 s deadline."""
    printed = _fresh("import asyncio, sys, threading\n"
                     "from resmgr.app.daemon import Daemon\n"
                     "where = []\n"
                     "class Watch:\n"
                     "    def find_spec(self, name, path=None, target=None):\n"
                     "        if name == 'h2':\n"
                     "            where.append(threading.current_thread() is threading.main_thread())\n"
                     "        return None\n"
                     "sys.meta_path.insert(0, Watch())\n"
                     "class Front:\n"
                     "    def serving(self):\n"
                     "        return ''\n"
                     "async def main():\n"
                     "    try:\n"
                     "        await Daemon._serve_link(object(), None, Front())\n"
                     "    except AttributeError:\n"
                     "        pass  # past the load: no core to serve\n"
                     "asyncio.run(main())\n"
                     "print(where)")
    assert printed.split() == ["[False]"]


def test_a_daemon_loads_only_the_policies_it_runs():
    loaded = _modules_after("import resmgr.app.daemon\nfrom resmgr import policies\n"
                            "from tests.support.world import machine\n"
                            "policies.create('static', {}, machine('sockets=1,nodes=1,cores=2,threads=1'))")
    assert "resmgr.policies.static" in loaded
    assert not {m for m in loaded if m.startswith(("resmgr.policies.topology_aware", "resmgr.policies.balloons",
                                                    "resmgr.policies.podpools"))}


def test_every_registered_name_is_its_policys_own():
    from resmgr import policies

    assert {name: entry.factory.name for name, entry in policies.REGISTRY.items()} == \
        {name: name for name in policies.REGISTRY}
