"""The state file when the disk says no: a full file system never fails the call that saves, is
reported while it lasts, and the state is written once there is room; short writes are finished."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Callable

import pytest

from resmgr import metrics
from resmgr.engine import store as store_mod
from resmgr.engine.store import StateNotWritten, StateStore


class Disk:
    """os.write as the store sees it: full (ENOSPC), or taking at most `chunk` bytes a call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.chunk = 0
        self.calls = 0
        real = os.write

        def write(fd: int, data: bytes) -> int:
            self.calls += 1
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, bytes(data[:self.chunk]) if self.chunk else data)

        monkeypatch.setattr(store_mod.os, "write", write)


def test_a_write_that_takes_part_of_the_data_is_finished(tmp_path, monkeypatch):
    disk = Disk(monkeypatch)
    disk.chunk = 7
    StateStore(tmp_path).write({"pods": [{"id": "p" * 100}]})
    assert json.loads((tmp_path / "cache").read_text())["pods"] == [{"id": "p" * 100}]
    assert disk.calls > 10


async def test_a_full_disk_fails_no_save_is_reported_and_the_state_is_written_once_there_is_room(
        tmp_path, monkeypatch):
    metrics.enable()
    disk = Disk(monkeypatch)
    store = StateStore(tmp_path)
    monkeypatch.setattr(store_mod, "RETRY_FIRST", 0.05)
    state = {"pods": ["a"]}
    await store.save(lambda: dict(state))
    assert store.problem == ""

    disk.full = True
    state["pods"] = ["a", "b"]
    await store.save(lambda: dict(state))  # no exception: the caller's call goes on
    assert "No space left on device" in store.problem and str(tmp_path / "cache") in store.problem
    assert metrics.STATE_FAILING.labels("cache")._value.get() == 1
    assert json.loads((tmp_path / "cache").read_text())["pods"] == ["a"]  # the old state, whole
    assert not (tmp_path / ".cache.tmp").exists()  # no half-written file holding room
    with pytest.raises(StateNotWritten, match="No space left"):
        await store.save(lambda: dict(state), strict=True)

    keeper = asyncio.create_task(store.keep_written())
    await asyncio.sleep(0.3)  # retries keep failing meanwhile
    state["pods"] = ["a", "b", "c"]
    disk.full = False
    for _ in range(100):
        if not store.problem:
            break
        await asyncio.sleep(0.05)
    keeper.cancel()
    assert store.problem == "" and metrics.STATE_FAILING.labels("cache")._value.get() == 0
    assert json.loads((tmp_path / "cache").read_text())["pods"] == ["a", "b", "c"]  # the latest, not the failed one


def test_a_temporary_file_left_by_a_crash_is_removed_at_start(tmp_path):
    (tmp_path / ".cache.tmp").write_text("x" * 1000)
    StateStore(tmp_path).prepare()
    assert not (tmp_path / ".cache.tmp").exists()


def test_a_state_of_a_newer_version_is_refused_and_left_where_it_is(tmp_path):
    """A rollback must not start afresh on a state it cannot read, nor lose the newer daemon's file."""
    from resmgr.engine.store import NEWEST, StateTooNew

    store = StateStore(tmp_path)
    store.prepare()
    store.write({"version": NEWEST + 1, "pods": [], "containers": [], "later": {}})
    with pytest.raises(StateTooNew, match=r"written by a newer cri-resmgr \(state version 3; this one reads "
                                          r"versions up to 2\)\. Run the newer cri-resmgr again, or move"):
        store.load()
    assert json.loads(store.path.read_text())["version"] == NEWEST + 1
    assert [p.name for p in tmp_path.iterdir() if "broken" in p.name] == []
    store.write({"version": "2", "pods": [], "containers": []})  # nonsense: set aside as ever
    assert store.load() is None and [p for p in tmp_path.iterdir() if "broken" in p.name]


def test_the_engine_writes_the_oldest_state_version_that_holds_its_state(tmp_path):
    """Version 1 (what 0.1.0 reads); version 2, which development versions wrote while a vanished pod
    was remembered, is read back too."""
    from resmgr.engine import statefile

    store = StateStore(tmp_path)
    store.prepare()
    plain = {"pods": [], "containers": [], "previous": {"u1/a": "2"}}
    store.write(plain)
    assert json.loads(store.path.read_text())["version"] == 1
    assert store.load(statefile.check)["previous"] == {"u1/a": "2"}
    store.write({"version": 2, **plain, "vanished": {"u1": 1700000000.5}})
    assert store.load(statefile.check)["vanished"] == {"u1": 1700000000.5}



def test_a_state_written_before_the_node_booted_says_so(tmp_path):
    booted = store_mod.boot_time()
    assert 0 < booted < __import__("time").time()  # this machine's own /proc/stat
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n")
    assert store_mod.boot_time(str(tmp_path / "stat")) == 1700000000.0
    assert store_mod.boot_time(str(tmp_path / "missing")) == 0.0  # unknown: no reboot is assumed
    store = StateStore(tmp_path / "state")
    store.prepare()
    assert not store.written_before(booted)  # no state at all
    store.write({"version": 1, "pods": [], "containers": []})
    assert not store.written_before(booted)
    os.utime(store.path, (booted - 60, booted - 60))
    assert store.written_before(booted)


def allocating_within(monkeypatch: pytest.MonkeyPatch, free: Callable[[], int]) -> None:
    """The file system gives an allocation while it has that many bytes free."""
    def posix_fallocate(fd: int, offset: int, length: int) -> None:
        if offset + length > free():
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(store_mod.os, "posix_fallocate", posix_fallocate)


@pytest.mark.parametrize("how", ["full", "read-only"])
async def test_a_disk_that_fills_while_no_write_is_due_is_reported_without_waiting_for_one(tmp_path, monkeypatch,
                                                                                           how):
    """A quiet node has no write due for minutes: a file system that fills, or turns read-only after
    an error, is found by looking at it, and reported as the write it makes then fails."""
    metrics.enable()
    disk = Disk(monkeypatch)
    store = StateStore(tmp_path)
    monkeypatch.setattr(store_mod, "SPACE_EVERY", 0.05, raising=False)
    fs_now = {"free": 1 << 30, "flag": 0}
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        fs = list(real(path))
        fs[0] = fs[1] = 1  # f_bsize, f_frsize: free counts in bytes
        fs[3] = fs[4] = fs_now["free"]  # f_bfree, f_bavail
        fs[8] = fs_now["flag"]  # f_flag
        return os.statvfs_result(fs)

    monkeypatch.setattr(store_mod.os, "statvfs", statvfs)
    allocating_within(monkeypatch, lambda: fs_now["free"])
    await store.save(lambda: {"pods": ["a"]})
    keeper = asyncio.create_task(store.keep_written())
    try:
        await asyncio.sleep(0.2)
        assert disk.calls == 1  # room enough: no write but the one asked for
        disk.full = True  # what the write meets (ENOSPC; EROFS reads the same to the store)
        if how == "full":
            fs_now["free"] = 0
        else:
            fs_now["flag"] = os.ST_RDONLY
        for _ in range(100):
            if store.problem:
                break
            await asyncio.sleep(0.02)
        assert "cannot write the state" in store.problem
        assert metrics.STATE_FAILING.labels("cache")._value.get() == 1
        disk.full, fs_now["free"], fs_now["flag"] = False, 1 << 30, 0
        for _ in range(100):
            if not store.problem:
                break
            await asyncio.sleep(0.05)
        assert store.problem == ""
    finally:
        keeper.cancel()


async def test_a_full_disk_is_reported_though_each_write_fits_in_the_blocks_the_one_before_freed(tmp_path,
                                                                                                monkeypatch):
    """The disk filled while a write's new file stood beside the old one: once renamed, the old
    one's blocks are all that is free, and every write of a state no larger fits in them. Nothing
    fails, yet the next larger state will: the full disk is reported all the same, until it has
    room again."""
    metrics.enable()
    Disk(monkeypatch)  # every write goes through
    store = StateStore(tmp_path)
    monkeypatch.setattr(store_mod, "SPACE_EVERY", 0.05, raising=False)
    free = {"bytes": 1 << 30}
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        fs = list(real(path))
        fs[0] = fs[1] = 1
        fs[3] = fs[4] = free["bytes"]
        return os.statvfs_result(fs)

    monkeypatch.setattr(store_mod.os, "statvfs", statvfs)
    allocating_within(monkeypatch, lambda: free["bytes"])
    await store.save(lambda: {"pods": ["a"]})
    keeper = asyncio.create_task(store.keep_written())
    try:
        free["bytes"] = 4096
        for _ in range(100):
            if store.problem:
                break
            await asyncio.sleep(0.02)
        assert store.problem.startswith("cannot write the state") and "full (4096 bytes free" in store.problem
        assert store.failing == ""  # the writes themselves work
        assert metrics.STATE_FAILING.labels("cache")._value.get() == 1
        free["bytes"] = 1 << 30
        for _ in range(100):
            if not store.problem:
                break
            await asyncio.sleep(0.02)
        assert store.problem == ""
        assert metrics.STATE_FAILING.labels("cache")._value.get() == 0
    finally:
        keeper.cancel()
