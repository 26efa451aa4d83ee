"""The Debian package's postinst: what it starts and where it points kubelet, on a first install and
on an upgrade or rollback of a node running the relay or the NRI plugin. Run under $DPKG_ROOT (a
directory standing for the host) with a systemctl that keeps the units' states in files there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
POSTINST = ROOT / "packaging" / "deb" / "postinst"
DROPIN = "/etc/kubernetes/kubelet.conf.d"

# Units are "active" while a file of their name is in $DPKG_ROOT/units; starting the relay's makes
# its socket (the postinst waits for it) and stops the NRI plugin's, as the units' Conflicts= does.
SYSTEMCTL = r"""#!/bin/sh
echo "$*" >> "$DPKG_ROOT/calls"
u="$DPKG_ROOT/units"
start() {
    touch "$u/$1"
    case $1 in
    cri-resmgr.service) rm -f "$u/cri-resmgr-nri.service"
        python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
            "$DPKG_ROOT/var/run/cri-resmgr/cri-resmgr.sock" 2>/dev/null || true ;;
    cri-resmgr-nri.service) rm -f "$u/cri-resmgr.service" ;;
    esac
}
case $1 in
is-active) [ -e "$u/$3" ] ;;
is-enabled) [ -e "$u/$3" ] ;;  # a unit that runs was enabled; a removed package's are disabled
restart) start "$2" ;;
try-restart) shift; for x in "$@"; do [ -e "$u/$x" ] && start "$x"; done; true ;;
*) true ;;
esac
"""


def host(tmp_path: Path, active: tuple[str, ...], dropin: bool) -> Path:
    root = tmp_path / "root"
    for d in ("run/systemd/system", "var/run/cri-resmgr", "units", "bin", "usr/share/cri-resmgr",
              "etc/default", DROPIN.lstrip("/")):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/default/cri-resmgr").write_text(f"KUBELET_CONFIG_DIR={DROPIN}\n")
    (root / "usr/share/cri-resmgr/kubelet-dropin.conf").write_text("containerRuntimeEndpoint: relay\n")
    if dropin:
        (root / DROPIN.lstrip("/") / "50-cri-resmgr.conf").write_text("containerRuntimeEndpoint: relay\n")
    for unit in active:
        (root / "units" / unit).touch()
    (root / "bin" / "systemctl").write_text(SYSTEMCTL)
    (root / "bin" / "systemctl").chmod(0o755)
    return root


def postinst(root: Path, *args: str) -> tuple[set[str], bool, list[str]]:
    """Runs the script; returns the active units after it, whether kubelet's drop-in is there, and
    the systemctl calls it made."""
    env = dict(os.environ, DPKG_ROOT=str(root), PATH=f"{root / 'bin'}:{os.environ['PATH']}")
    subprocess.run(["sh", str(POSTINST), "configure", *args], env=env, check=True, timeout=60)
    calls = (root / "calls").read_text().splitlines() if (root / "calls").exists() else []
    return ({p.name for p in (root / "units").iterdir()}, (root / DROPIN.lstrip("/") / "50-cri-resmgr.conf").exists(),
            calls)


@pytest.mark.unit
def test_a_first_install_runs_the_relay_and_points_kubelet_at_it(tmp_path: Path) -> None:
    units, dropin, calls = postinst(host(tmp_path, ("kubelet.service",), dropin=False))
    assert units == {"cri-resmgr.service", "kubelet.service"} and dropin
    assert "enable cri-resmgr.service" in calls and "restart kubelet.service" in calls


@pytest.mark.unit
def test_an_upgrade_of_a_node_running_the_nri_plugin_keeps_it_and_leaves_kubelet_on_containerd(
        tmp_path: Path) -> None:
    root = host(tmp_path, ("cri-resmgr-nri.service", "cri-resmgr-agent.service", "kubelet.service"), dropin=False)
    units, dropin, calls = postinst(root, "0.2.0")
    assert units == {"cri-resmgr-nri.service", "cri-resmgr-agent.service", "kubelet.service"}
    assert not dropin and not any(c.startswith(("enable", "restart")) for c in calls), calls
    assert "try-restart cri-resmgr.service cri-resmgr-nri.service cri-resmgr-agent.service" in calls


@pytest.mark.unit
def test_an_upgrade_of_a_relay_node_restarts_the_relay_and_the_agent_and_leaves_kubelet_be(tmp_path: Path) -> None:
    root = host(tmp_path, ("cri-resmgr.service", "cri-resmgr-agent.service", "kubelet.service"), dropin=True)
    units, dropin, calls = postinst(root, "0.2.0")
    assert units == {"cri-resmgr.service", "cri-resmgr-agent.service", "kubelet.service"} and dropin
    assert "restart kubelet.service" not in calls and not any(c.startswith("enable") for c in calls), calls


@pytest.mark.unit
def test_a_reinstall_after_a_removal_runs_the_relay_as_a_first_install(tmp_path: Path) -> None:
    """dpkg passes the removed version when the configuration files were kept; the removal disabled
    both units, so nothing would run (the node left without cri-resmgr)."""
    units, dropin, calls = postinst(host(tmp_path, ("kubelet.service",), dropin=False), "0.3.0")
    assert units == {"cri-resmgr.service", "kubelet.service"} and dropin
    assert "enable cri-resmgr.service" in calls and "restart kubelet.service" in calls
