"""Live configuration: pushes over the config link, SIGHUP reloads, policy switches, persistence."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.support.helpers import (
    ONLINE,
    ROOT,
    Cri,
    cgroup_cpus,
    cgroup_cpuset,
    container_config,
    pod_config,
    relay_with_link,
    resources,
)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "resmgr", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)





def connects_as(uid: int, path: str) -> bool:
    """Whether a process of that user (and group) can connect to the unix socket."""
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(3)")
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3",
                           "-c", probe, path], capture_output=True, text=True, timeout=30)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


def test_a_socket_group_lets_an_unprivileged_agent_reach_the_link_and_no_one_else(containerd, workdir):
    """The agent in the chart runs as the image's user 65532; cri-resmgr grants that group the link."""
    workdir.chmod(0o711)  # the test's own directory, passable like /var/run
    relay, link = relay_with_link(workdir, containerd, "--config-socket-group", "65532")
    try:
        path = str(workdir / "cfg" / "config.sock")
        assert link.status().policy
        assert connects_as(65532, path) and not connects_as(65533, path)
    finally:
        link.close()
        relay.stop()
    # Without the option the link is root's alone.
    relay, link = relay_with_link(workdir, containerd)
    try:
        assert not connects_as(65532, str(workdir / "cfg" / "config.sock"))
    finally:
        link.close()
        relay.stop()
    refused = cli("--config-socket-group", "no-such-group-here", "--help")
    assert refused.returncode == 2 and "no group 'no-such-group-here'" in refused.stderr


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_pushed_configuration_switches_policies_and_survives_restarts(containerd, workdir):
    relay, link = relay_with_link(workdir, containerd)
    via = Cri(relay.socket)
    pods = []
    try:
        sock = workdir / "cfg" / "config.sock"
        assert sock.stat().st_mode & 0o777 == 0o600
        assert link.status().policy == "none"
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=resources(1000, True)))
        s_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(s_cfg))
        s = via.run_container(pods[-1], s_cfg, container_config(resources=resources(0, False)))
        assert cgroup_cpus(g_cfg, g) == ONLINE == cgroup_cpus(s_cfg, s)

        # none -> static: running containers are re-allocated and re-pinned.
        assert link.push({"policy": "Active: static\n"}) == ""
        mine = cgroup_cpus(g_cfg, g)
        assert len(mine) == 1 and cgroup_cpus(s_cfg, s) == ONLINE - mine
        status = link.status()
        assert status.policy == "static" and status.source == "agent (node node-1)" and not status.last_error

        # Bad input is refused with the reason, and nothing changes.
        error = link.push({"policy": "Active: [static"})
        assert "not valid YAML" in error
        error = link.push({"policy.static": "RelaxedIsolation: perhaps\n"})
        assert "policy.static.RelaxedIsolation" in error
        everything = f"{min(ONLINE)}-{max(ONLINE)}"
        error = link.push({"policy": f"Active: topology-aware\nReservedResources:\n  cpu: cpuset:{everything}\n"})
        assert error and link.status().policy == "static" and link.status().last_error == error
        assert cgroup_cpus(g_cfg, g) == mine and cgroup_cpus(s_cfg, s) == ONLINE - mine

        # static -> topology-aware: memory gets pinned too.
        assert link.push({"policy": "Active: topology-aware\n", "logger": "Debug: [config]\n"}) == ""
        mine = cgroup_cpus(g_cfg, g)
        assert len(mine) == 1 and cgroup_cpus(s_cfg, s) == ONLINE - mine
        assert cgroup_cpuset(g_cfg, g, "mems")
        link.close()

        # The pushed configuration is used again after a restart, even a kill -9.
        relay.stop(signal.SIGKILL)
        via.close()
        relay, link = relay_with_link(workdir, containerd, relay_dir=relay.relay_dir)
        via = Cri(relay.socket)
        status = link.status()
        assert status.policy == "topology-aware" and "persisted" in status.source
        assert cgroup_cpus(g_cfg, g) == mine
        link.close()
        relay.stop()

        # With policy switching disabled, a push that switches is refused.
        relay, link = relay_with_link(workdir, containerd, "--disable-policy-switch", relay_dir=relay.relay_dir)
        via.close()
        via = Cri(relay.socket)
        assert "disabled" in link.push({"policy": "Active: static\n"})
        assert link.status().policy == "topology-aware"
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        link.close()
        relay.stop()


def test_forced_configuration_reloads_on_sighup_and_refuses_pushes(containerd, workdir):
    forced = workdir / "forced.yaml"
    forced.write_text("policy:\n  Active: none\n")
    relay, link = relay_with_link(workdir, containerd, "--force-config", str(forced))
    try:
        assert "forced by" in link.push({"policy": "Active: static\n"})
        forced.write_text("policy:\n  Active: static\n")
        relay.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while link.status().policy != "static" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.status().policy == "static"
        forced.write_text("policy:\n  Active: [broken\n")
        relay.proc.send_signal(signal.SIGHUP)
        while not link.status().last_error and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "not valid YAML" in link.status().last_error and link.status().policy == "static"
        out = cli("status", "--config-socket", str(workdir / "cfg" / "config.sock"))
        assert out.returncode == 3 and "policy: static" in out.stdout and "rejected" in out.stdout
        assert f"source: forced config file {forced}" in out.stdout
        out = cli("--reset-config", "--relay-socket", relay.socket, "--relay-dir", str(relay.relay_dir))
        assert out.returncode == 1 and "cannot reset while cri-resmgr runs" in out.stderr
    finally:
        link.close()
        assert relay.stop() == 0


def test_reset_config_and_print_config_use_the_persisted_push(tmp_path):
    from resmgr.control.manager import Sources

    Sources(state_dir=str(tmp_path)).pushed_store().write(
        {"node_name": "n1", "config": {"policy": "Active: static-plus\n"}})
    args = ("--relay-dir", str(tmp_path), "--relay-socket", str(tmp_path / "relay.sock"))
    out = cli("--print-config", *args)
    assert out.returncode == 0 and "Active: static-plus" in out.stdout and "agent (node n1" in out.stdout
    fallback = tmp_path / "fallback.yaml"
    fallback.write_text("policy:\n  Active: static\n")
    out = cli("--print-config", "--fallback-config", str(fallback), *args)
    assert "Active: static-plus" in out.stdout  # a push wins over the fallback file
    out = cli("--reset-config", *args)
    assert out.returncode == 0 and "pushed configuration removed" in out.stdout
    out = cli("--print-config", "--fallback-config", str(fallback), *args)
    assert "Active: static\n" in out.stdout and "fallback config file" in out.stdout


def test_disabled_policy_switch_refuses_to_start_on_another_policys_allocations(containerd, workdir):
    config = workdir / "policy.yaml"
    config.write_text("policy:\n  Active: static\n")
    relay, link = relay_with_link(workdir, containerd, "--force-config", str(config))
    link.close()
    assert relay.stop() == 0
    config.write_text("policy:\n  Active: topology-aware\n")
    out = cli("--force-config", str(config), "--disable-policy-switch", "--relay-dir", str(relay.relay_dir),
              "--relay-socket", str(workdir / "again.sock"), "--runtime-socket", containerd.socket,
              "--config-socket", str(workdir / "cfg2" / "config.sock"))
    assert out.returncode == 1
    assert "allocated by the static policy" in out.stderr and "--disable-policy-switch" in out.stderr
    out = cli("--reset-policy", "--relay-dir", str(relay.relay_dir), "--relay-socket", str(workdir / "again.sock"))
    assert out.returncode == 0 and "policy allocations dropped" in out.stdout
    relay, link = relay_with_link(workdir, containerd, "--force-config", str(config), "--disable-policy-switch",
                        relay_dir=relay.relay_dir)
    try:
        assert link.status().policy == "topology-aware"
    finally:
        link.close()
        relay.stop()
