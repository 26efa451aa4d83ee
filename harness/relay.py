"""cri-resmgr started as a real process on a private socket, for tests, conformance runs and
benchmarks: one launcher, so they all run the relay the same way."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_socket(path: str, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until something accepts connections on the unix socket."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before serving {path}")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            return
        except OSError:
            time.sleep(0.02)
        finally:
            s.close()
    raise TimeoutError(f"nothing serves {path} after {timeout}s")


class RelayProcess:
    """cri-resmgr run as a real process, as kubelet would see it."""

    def __init__(self, workdir: Path, runtime_socket: str, *extra: str,
                 relay_dir: Path | None = None) -> None:
        self.workdir = workdir
        self.socket = str(workdir / "relay.sock")
        self.relay_dir = relay_dir or workdir / "state"
        self.log_path = workdir / f"relay-{uuid.uuid4().hex[:6]}.log"
        self.args = [sys.executable, "-m", "resmgr", "--relay-socket", self.socket,
                     "--runtime-socket", runtime_socket, "--state-dir", str(self.relay_dir),
                     "--log-level", "DEBUG", "--config-socket", str(workdir / "config.sock"), *extra]
        self.proc: subprocess.Popen | None = None
        self.cwd = ROOT

    def of_release(self, python: Path, home: Path) -> RelayProcess:
        """Run another build (a release's virtual environment) instead of this tree's."""
        self.args[0], self.cwd = str(python), home
        return self

    def start(self, wait: bool = True) -> RelayProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd)
        log.close()
        if wait:
            try:
                wait_socket(self.socket, proc=self.proc)
                self.wait_link()
            except (TimeoutError, RuntimeError) as err:
                self._kill()  # no fixture will stop what never started
                raise type(err)(f"{err}; its log ends:\n{self.log()[-3000:]}") from None
        return self

    def wait_link(self) -> None:
        """Until the config link (the last --config-socket given) takes connections, unless disabled:
        it is served just after the front end takes calls."""
        link = self.args[len(self.args) - self.args[::-1].index("--config-socket")]
        if link != "disabled":
            wait_socket(link, proc=self.proc)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()  # not left behind to hold sockets and CPUs for the tests after
            raise

    def _kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel("unix://" + self.socket)


def policy_config(workdir: Path, policy: str, reserved: str = "") -> Path:
    """A configuration file that names the policy (and reserved CPUs: a ReservedResources cpu value,
    such as cpuset:0)."""
    config = workdir / f"{policy}.yaml"
    text = f"policy:\n  Active: {policy}\n"
    if reserved:
        text += f"  ReservedResources:\n    cpu: \"{reserved}\"\n"
    config.write_text(text)
    return config


def policy_relay(workdir: Path, runtime_socket: str, policy: str, *extra: str,
                 relay_dir: Path | None = None, reserved: str = "") -> RelayProcess:
    """A relay (not started) forced to the policy's configuration (see policy_config)."""
    return RelayProcess(workdir, runtime_socket, "--force-config", str(policy_config(workdir, policy, reserved)),
                        *extra, relay_dir=relay_dir)


class NriProcess(RelayProcess):
    """cri-resmgr run as an NRI plugin of a private containerd (its NRI socket is {dir}/nri.sock)."""

    def __init__(self, workdir: Path, nri_socket: str, *extra: str, relay_dir: Path | None = None) -> None:
        super().__init__(workdir, "", *extra, relay_dir=relay_dir)
        self.args = [sys.executable, "-m", "resmgr", "--nri", "--nri-socket", nri_socket,
                     "--state-dir", str(self.relay_dir), "--log-level", "DEBUG",
                     "--config-socket", str(workdir / "config.sock"), *extra]
        self.syncs = 0

    def start(self, wait: bool = True) -> NriProcess:
        self.syncs = self.log().count("NRI: synchronized") if self.log_path.exists() else 0
        super().start(wait=False)
        if wait:
            self.wait_synchronized()
            self.wait_link()
        return self

    def wait_synchronized(self, timeout: float = 20.0) -> None:
        """Until the runtime has synchronized this plugin once more than before."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"NRI plugin exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if self.log_path.exists() and self.log().count("NRI: synchronized") > self.syncs:
                self.syncs += 1
                return
            time.sleep(0.02)
        self._kill()
        raise TimeoutError(f"NRI plugin not synchronized after {timeout}s:\n{self.log()[-3000:]}")


def policy_nri(workdir: Path, nri_socket: str, policy: str, *extra: str, relay_dir: Path | None = None,
               reserved: str = "") -> NriProcess:
    """An NRI plugin (not started) forced to the policy's configuration (see policy_config)."""
    return NriProcess(workdir, nri_socket, "--force-config", str(policy_config(workdir, policy, reserved)),
                      *extra, relay_dir=relay_dir)
