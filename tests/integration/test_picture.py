"""The node picture, drawn by headless Chromium from a running relay and from `simulate --html`."""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.relay import free_port
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from resmgr.view import client
from tests.support.helpers import (
    ONLINE,
    ROOT,
    Cri,
    RelayProcess,
    cgroup_cpus,
    container_config,
    pod_config,
    resources,
    wait_until,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (scripts/setup.sh installs it)")


def chromium(url: str, *args: str) -> str:
    """Load url headless, let its script run (virtual time), and return what Chromium prints."""
    assert CHROMIUM is not None
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--no-first-run", "--hide-scrollbars", "--window-size=1400,1000",
                          "--virtual-time-budget=4000", *args, url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


class Cpus(html.parser.HTMLParser):
    """The CPU cells of a rendered page: id -> (role, holders, text), and where each sits."""

    def __init__(self) -> None:
        super().__init__()
        self.cpus: dict[int, dict] = {}
        self.stack: list[dict[str, str]] = []
        self.current: int | None = None
        self.rows: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        self.stack.append(a)
        if "data-cpu" in a:
            place = {k: next((s[k] for s in reversed(self.stack) if k in s), None)
                     for k in ("data-socket", "data-die", "data-node")}
            self.current = int(a["data-cpu"])
            self.cpus[self.current] = {"role": a["data-role"], "holders": a["data-holders"].split(), "text": "",
                                       "socket": place["data-socket"], "node": place["data-node"]}
        if "data-container" in a:
            self.rows.append(a["data-container"])

    def handle_endtag(self, tag: str) -> None:
        a = self.stack.pop() if self.stack else {}
        if "data-cpu" in a:
            self.current = None

    def handle_data(self, data: str) -> None:
        if self.current is not None:
            self.cpus[self.current]["text"] += data


def rendered(url: str) -> Cpus:
    page = Cpus()
    page.feed(chromium(url, "--dump-dom"))
    return page


@needs_chromium
@pytest.mark.skipif(ONLINE != CPUSet.parse("0-1"), reason="the generated machine's CPUs must exist here")
def test_live_picture_of_a_two_socket_machine(containerd, workdir):
    # Two sockets of one CPU each, so the relay's picture and the real cgroups agree.
    root = generate(parse_spec("sockets=2,nodes=1,cores=1,threads=1"), workdir / "host")
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    address = f"127.0.0.1:{free_port()}"
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config), "--host-root", str(root),
                         "--metrics-address", address).start()
    via = Cri(relay.socket)
    pods = []
    url = f"http://{address}/"
    try:
        before = rendered(url)
        assert set(before.cpus) == {0, 1} and all(c["role"] == "free" for c in before.cpus.values())
        assert {c["socket"] for c in before.cpus.values()} == {"0", "1"}

        cfg = pod_config(name="db", qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(cfg))
        db = via.run_container(pods[-1], cfg, container_config(name="postgres", resources=resources(1000, True)))
        web_cfg = pod_config(name="web", qos="burstable", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(web_cfg))
        via.run_container(pods[-1], web_cfg, container_config(name="nginx", resources=resources(100, False)))
        (mine,) = cgroup_cpus(cfg, db)
        doc = client.state(address)
        ctr = next(c for p in doc["pods"] for c in p["containers"] if c["id"] == db)
        assert ctr["exclusive"] == str(mine)

        after = rendered(url)
        cell = after.cpus[mine]
        assert cell["role"] == "exclusive" and cell["holders"] == ["default/db/postgres"]
        assert "postgres" in cell["text"] and cell["socket"] == str(mine) and cell["node"] == str(mine)
        other = after.cpus[1 - mine]
        assert other["role"] == "shared" and other["holders"] == ["default/web/nginx"]
        assert after.rows == ["default/db/postgres", "default/web/nginx"]

        shot = workdir / "picture.png"
        chromium(url, f"--screenshot={shot}")
        assert shot.stat().st_size > 10000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        keep = ROOT / ".test-artifacts"
        keep.mkdir(exist_ok=True)
        shutil.copy(shot, keep / "node-picture.png")  # for a person to look at

        # It follows the node by itself: the exclusive container goes, the page shows its CPU shared.
        via.remove_pod(pods.pop(0))
        wait_until(lambda: rendered(url).cpus[mine]["role"] == "shared", timeout=30,
                   what="the page redrawn after the removal")
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


@needs_chromium
def test_simulate_writes_the_same_picture(tmp_path):
    (tmp_path / "pods.yaml").write_text(
        "- name: db\n  containers:\n  - name: postgres\n    requests: {cpu: 2, memory: 1Gi}\n"
        "    limits: {cpu: 2, memory: 1Gi}\n"
        "- name: web\n  containers:\n  - name: nginx\n    requests: {cpu: 500m}\n")
    (tmp_path / "config.yaml").write_text("policy:\n  Active: topology-aware\n  ReservedResources:\n    CPU: 1\n")
    page = tmp_path / "what-if.html"
    out = subprocess.run([sys.executable, "-m", "resmgr", "simulate", "--machine",
                          "sockets=2,nodes=2,cores=4,threads=2", "--config", str(tmp_path / "config.yaml"),
                          "--pods", str(tmp_path / "pods.yaml"),
                          "--html", str(page), "--output", "json"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    postgres = next(c for c in result["containers"] if c["name"] == "postgres")
    text = page.read_text()
    assert "CRI_RESMGR_STATE" in text and "fetch(" in text  # the live page's script, with the state inlined
    drawn = rendered(Path(page).as_uri())
    chromium(Path(page).as_uri(), f"--screenshot={tmp_path / 'what-if.png'}")
    keep = ROOT / ".test-artifacts"
    keep.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "what-if.png", keep / "simulate-picture.png")
    assert len(drawn.cpus) == 32 and {c["socket"] for c in drawn.cpus.values()} == {"0", "1"}
    held = {cpu for cpu, c in drawn.cpus.items() if c["holders"] == ["default/db/postgres"]}
    assert held == set(CPUSet.parse(postgres["cpus"]))
    assert all(drawn.cpus[cpu]["role"] == "exclusive" for cpu in held)
    assert sum(c["role"] == "reserved" for c in drawn.cpus.values()) == 1
    assert drawn.rows == ["default/db/postgres", "default/web/nginx"]
