"""The soak's sampler on real processes: what runs in a scope is read anew each time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.soak import sampler


def test_a_process_that_executes_another_program_is_seen_as_that_program():
    """runc's init is "exe" until it executes the container's process (a sandbox's `pause`): a name
    read once must not stand for the pid ever after, or every sandbox seen early runs "something"."""
    proc = subprocess.Popen(["sh", "-c", "read x; exec sleep 30"], stdin=subprocess.PIPE)
    try:
        pid = str(proc.pid)
        assert _becomes(pid, "sh")  # once the forked child has executed sh
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert _becomes(pid, "sleep")
    finally:
        proc.kill()
        proc.wait()


def _becomes(pid: str, name: str) -> bool:
    deadline = time.monotonic() + 10
    while sampler.comm(pid) != name and time.monotonic() < deadline:
        time.sleep(0.02)
    return sampler.comm(pid) == name


def test_runcs_init_under_any_of_its_names_is_not_the_containers_own_process():
    assert all(sampler.is_init(n) for n in ("exe", "runc", "runc:[2:INIT]"))
    assert not any(sampler.is_init(n) for n in ("pause", "sleep", "sh"))


def test_a_program_executed_from_a_descriptor_is_named_after_it_and_seen_as_runcs_init():
    """runc executes its init from a copy of itself it holds open, and the kernel names such a
    process after the descriptor ("6") until it executes the container's process: a sandbox scope
    "running something besides pause", a Burstable container seen on every CPU while being made."""
    script = ("import os; fd = os.open('/bin/sleep', os.O_RDONLY); os.set_inheritable(fd, True); "
              "os.execv(f'/proc/self/fd/{fd}', ['sleep', '30'])")
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not sampler.comm(str(proc.pid)).isdigit() and time.monotonic() < deadline:
            time.sleep(0.02)
        name = sampler.comm(str(proc.pid))
        assert name.isdigit(), name
        assert sampler.is_init(name)
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_runs_nothing():
    """A container whose processes have exited but are not reaped yet runs nothing: its CPUs are
    free to be someone else's."""
    proc = subprocess.Popen(["sleep", "0"])
    deadline = time.monotonic() + 10
    while sampler.comm(str(proc.pid)) and time.monotonic() < deadline:  # exited, not reaped: a zombie
        time.sleep(0.02)
    assert sampler.comm(str(proc.pid)) == "" and Path(f"/proc/{proc.pid}").exists()
    proc.wait()


def test_the_journal_is_read_from_the_start_of_the_second_asked_for():
    # journalctl takes whole seconds: rounding 25.65 up to 26 dropped a line logged at 25.70.
    from harness.soak.guest import Guest
    from harness.vm import Result

    asked = []
    guest = Guest.__new__(Guest)
    guest.run = lambda cmd, timeout=60: asked.append(cmd) or Result(0, "", "")
    guest.journal("cri-resmgr", 1764391885.65)
    assert asked == ["journalctl -u cri-resmgr --no-pager -o cat --since @1764391885"]


def test_cpu_lists_are_read_and_written_as_the_kernel_writes_them():
    assert sampler.cpus_of("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert sampler.cpus_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert sampler.cpus_of("") == set() and sampler.cpus_text(set()) == ""


def _scope(pods: Path, cid: str, cpus: str) -> Path:
    d = pods / "kubepods-burstable.slice" / "kubepods-burstable-pod1.slice" / f"cri-containerd-{cid}.scope"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in (("cgroup.procs", f"{os.getpid()}\n"), ("cpuset.cpus.effective", cpus),
                       ("cpuset.mems.effective", "0"), ("cpu.max", "max 100000")):
        (d / name).write_text(text)
    return d


def test_a_cpu_moved_from_one_container_to_another_while_read_is_never_seen_under_both(tmp_path, monkeypatch):
    """The first container is read holding CPU 3, then CPU 3 moves to the second before that one is
    read: one look at each would show CPU 3 under both, an overlap that never was."""
    scopes = {"a": _scope(tmp_path, "a", ""), "b": _scope(tmp_path, "b", "")}
    real_read = sampler.read
    order: list[str] = []

    def other(cid: str) -> str:
        return "b" if cid == "a" else "a"

    def read(path: str) -> str:
        if path.endswith("cgroup.procs"):
            order.append(next(cid for cid, d in scopes.items() if path.startswith(str(d))))
            if len(order) == 1:  # the first read holds CPU 3, the other one not
                (scopes[order[0]] / "cpuset.cpus.effective").write_text("2-3")
                (scopes[other(order[0])] / "cpuset.cpus.effective").write_text("4")
            if len(order) == 2:  # the move lands between the two containers' reads
                (scopes[order[0]] / "cpuset.cpus.effective").write_text("2")
                (scopes[order[1]] / "cpuset.cpus.effective").write_text("3-4")
        return real_read(path)

    monkeypatch.setattr(sampler, "PODS", str(tmp_path))
    monkeypatch.setattr(sampler, "read", read)
    got = sampler.containers()
    first, second = order[:2]
    assert got[second][1] == "3-4"
    assert got[first][1] == "2", got  # CPU 3 kept only where both looks saw it


def test_every_read_of_a_round_that_changes_all_the_time_is_returned_unconfirmed(tmp_path, monkeypatch):
    a = _scope(tmp_path, "a", "1")
    monkeypatch.setattr(sampler, "PODS", str(tmp_path))
    n = iter(range(1, 100))
    real = sampler.containers

    def moving() -> dict:
        (a / "cpuset.cpus.effective").write_text(str(next(n)))
        return real()

    monkeypatch.setattr(sampler, "containers", moving)
    seen, agreed = sampler.reads(None, tries=3)
    assert not agreed and [s["a"][1] for _, s in seen] == ["1", "2", "3", "4"]
    monkeypatch.setattr(sampler, "containers", real)
    seen, agreed = sampler.reads(None)
    assert agreed and len(seen) == 1
    assert sampler.reads(seen[0][1]) == ([], True)
