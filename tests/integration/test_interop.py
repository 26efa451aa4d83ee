"""A second HTTP/2 implementation as the client: curl (nghttp2) speaking gRPC by hand.

gRPC's own client always opens with a pass-through call and tolerates some ordering;
curl is stricter and lets the first call on a connection be one the relay answers.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from resmgr.generated.cri import api_pb2 as cri

pytestmark = [
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed (scripts/setup.sh)"),
]


def curl_grpc(socket: str, method: str, msg, tmp_path) -> tuple[int, str, bytes]:
    body = msg.SerializeToString()
    req = tmp_path / "req"
    req.write_bytes(b"\0" + len(body).to_bytes(4, "big") + body)
    out = tmp_path / "out"
    p = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "--unix-socket", socket, "-D", "-",
                        "-o", str(out), "-H", "content-type: application/grpc", "-H", "te: trailers",
                        "--data-binary", f"@{req}", f"http://localhost/runtime.v1.RuntimeService/{method}"],
                       capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(), out.read_bytes() if out.exists() else b""


@pytest.mark.parametrize("method,msg", [
    ("Version", cri.VersionRequest(version="v1")),
    ("ContainerStatus", cri.ContainerStatusRequest(container_id="no-such-container")),
    ("StartContainer", cri.StartContainerRequest(container_id="no-such-container")),
    ("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id="no-such-pod")),
])
def test_curl_sees_the_same_answer(containerd, relay, relay_mode, method, msg, tmp_path):
    direct = curl_grpc(containerd.socket, method, msg, tmp_path)
    via = curl_grpc(relay.socket, method, msg, tmp_path)
    assert direct[0] == 0
    assert grpc_level(via) == grpc_level(direct)
    if relay_mode == "splice":  # frames pass verbatim, and our own answers look like the runtime's
        assert via == direct


def grpc_level(result: tuple[int, str, bytes]) -> tuple:
    rc, headers, body = result
    fields = dict(line.split(": ", 1) for line in headers.splitlines() if ": " in line)
    return rc, fields.get("grpc-status"), fields.get("grpc-message", ""), body


def test_curl_gets_unavailable_when_runtime_is_down(workdir, relay_mode, tmp_path):
    from tests.support.helpers import RelayProcess

    missing = str(workdir / "no-runtime.sock")
    relay = RelayProcess(workdir, missing, "--relay-mode", relay_mode).start()
    try:
        rc, headers, body = curl_grpc(relay.socket, "Version", cri.VersionRequest(), tmp_path)
    finally:
        relay.stop()
    status = grpc_level((rc, headers, body))
    assert status[:2] == (0, "14")  # UNAVAILABLE
    assert missing in status[2]
