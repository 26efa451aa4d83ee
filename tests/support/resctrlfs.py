"""A resctrl filesystem for tests, served with FUSE: the kernel's rules, in user space.

This kernel has no RDT, so tests mount this instead of /sys/fs/resctrl. It models what
the RDT controller relies on: `info/L3` and `info/MB` files, groups made with mkdir
(ENOSPC once every CLOS is taken) and removed with rmdir (their tasks return to the
root group), `schemata` writes checked like the kernel does (cache IDs, contiguous
capacity bitmasks within `cbm_mask` with at least `min_cbm_bits` bits, bandwidth
between `min_bandwidth` and 100, rounded up to `bandwidth_gran`; EINVAL otherwise, with
`info/last_cmd_status` saying why), and `tasks` writes of one PID each (ESRCH for a PID
that does not exist; a task is in exactly one group).

    python -m tests.support.resctrlfs MOUNTPOINT   # serves until unmounted
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass, field

import mfusepy

CACHE_IDS = (0, 1)
CBM_BITS = 12
MIN_CBM_BITS = 2
NUM_CLOSIDS = 8
MB_GRAN = 10
MB_MIN = 10


@dataclass
class Group:
    l3: dict[int, int] = field(default_factory=lambda: {i: (1 << CBM_BITS) - 1 for i in CACHE_IDS})
    mb: dict[int, int] = field(default_factory=lambda: {i: 100 for i in CACHE_IDS})
    tasks: set[int] = field(default_factory=set)

    def schemata(self) -> str:
        l3 = ";".join(f"{i}={m:x}" for i, m in sorted(self.l3.items()))
        mb = ";".join(f"{i}={v}" for i, v in sorted(self.mb.items()))
        return f"    L3:{l3}\n    MB:{mb}\n"


INFO = {
    "info/L3/cbm_mask": f"{(1 << CBM_BITS) - 1:x}\n",
    "info/L3/min_cbm_bits": f"{MIN_CBM_BITS}\n",
    "info/L3/num_closids": f"{NUM_CLOSIDS}\n",
    "info/L3/shareable_bits": "0\n",
    "info/MB/bandwidth_gran": f"{MB_GRAN}\n",
    "info/MB/delay_linear": "1\n",
    "info/MB/min_bandwidth": f"{MB_MIN}\n",
    "info/MB/num_closids": f"{NUM_CLOSIDS}\n",
}
GROUP_FILES = ("schemata", "tasks", "cpus", "cpus_list", "mode", "size")


class Invalid(Exception):
    pass


class Resctrl(mfusepy.Operations):
    use_ns = True

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {"": Group()}
        self.last_status = "ok\n"
        self._mutex = threading.Lock()
        self.now = time.time_ns()

    # -- lookup ---------------------------------------------------------------------------------
    def _split(self, path: str) -> tuple[str, str | None]:
        """(group name, file name or None) of a path inside a group; KeyError otherwise."""
        parts = [p for p in path.split("/") if p]
        if not parts:
            return "", None
        if parts[0] in self.groups and len(parts) <= 2 and parts[0] != "":
            if len(parts) == 1:
                return parts[0], None
            if parts[1] in GROUP_FILES:
                return parts[0], parts[1]
        if len(parts) == 1 and parts[0] in GROUP_FILES:
            return "", parts[0]
        raise KeyError(path)

    def _content(self, path: str) -> str:
        rel = path.lstrip("/")
        if rel in INFO:
            return INFO[rel]
        if rel == "info/last_cmd_status":
            return self.last_status
        name, fname = self._split(path)
        group = self.groups[name]
        return {"schemata": group.schemata(), "tasks": "".join(f"{t}\n" for t in sorted(group.tasks)),
                "cpus": "3\n", "cpus_list": "0-1\n", "mode": "shareable\n",
                "size": f"    L3:0={CBM_BITS};1={CBM_BITS}\n"}[fname]

    def _is_dir(self, path: str) -> bool:
        rel = path.strip("/")
        if rel in ("", "info", "info/L3", "info/MB"):
            return True
        return rel in self.groups

    # -- FUSE operations ----------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict:
        with self._mutex:
            base = {"st_uid": 0, "st_gid": 0, "st_atime": self.now, "st_mtime": self.now, "st_ctime": self.now}
            if self._is_dir(path):
                return {**base, "st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            try:
                content = self._content(path)
            except KeyError:
                raise mfusepy.FuseOSError(errno.ENOENT) from None
            mode = 0o444 if path.lstrip("/").startswith("info/") else 0o644
            return {**base, "st_mode": stat.S_IFREG | mode, "st_nlink": 1, "st_size": len(content)}

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._mutex:
            rel = path.strip("/")
            if rel == "":
                return [".", "..", "info", *GROUP_FILES, *sorted(g for g in self.groups if g)]
            if rel == "info":
                return [".", "..", "L3", "MB", "last_cmd_status"]
            if rel in ("info/L3", "info/MB"):
                return [".", ".."] + [k.rsplit("/", 1)[1] for k in INFO if k.startswith(rel + "/")]
            if rel in self.groups:
                return [".", "..", *GROUP_FILES]
            raise mfusepy.FuseOSError(errno.ENOENT)

    def open(self, path: str, flags: int) -> int:
        self.getattr(path)
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            try:
                return self._content(path).encode()[offset:offset + size]
            except KeyError:
                raise mfusepy.FuseOSError(errno.ENOENT) from None

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            try:
                name, fname = self._split(path)
            except KeyError:
                raise mfusepy.FuseOSError(errno.EACCES) from None
            try:
                if fname == "schemata":
                    self._schemata(self.groups[name], data.decode())
                elif fname == "tasks":
                    self._task(name, data.decode())
                else:
                    raise Invalid(f"{fname} is not writable here")
            except Invalid as err:
                self.last_status = f"{err}\n"
                raise mfusepy.FuseOSError(errno.EINVAL) from None
            self.last_status = "ok\n"
            return len(data)

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            parts = [p for p in path.split("/") if p]
            if len(parts) != 1 or parts[0] == "info":
                raise mfusepy.FuseOSError(errno.EPERM)
            if parts[0] in self.groups:
                raise mfusepy.FuseOSError(errno.EEXIST)
            if len(self.groups) >= NUM_CLOSIDS:  # the root group holds a CLOS too
                self.last_status = "out of CLOSIDs\n"
                raise mfusepy.FuseOSError(errno.ENOSPC)
            self.groups[parts[0]] = Group()
            return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            name = path.strip("/")
            if name not in self.groups or not name:
                raise mfusepy.FuseOSError(errno.EPERM if name in ("", "info") else errno.ENOENT)
            self.groups[""].tasks |= self.groups.pop(name).tasks
            return 0

    def create(self, path: str, mode: int, fi: object = None) -> int:
        raise mfusepy.FuseOSError(errno.EACCES)

    def unlink(self, path: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)

    # -- the kernel's rules ------------------------------------------------------------------------
    def _schemata(self, group: Group, text: str) -> None:
        l3, mb = dict(group.l3), dict(group.mb)
        for line in filter(None, (ln.strip() for ln in text.splitlines())):
            resource, _, values = line.partition(":")
            resource = resource.strip()
            if resource not in ("L3", "MB"):
                raise Invalid(f"Unknown or unsupported resource name '{resource}'")
            for item in filter(None, values.split(";")):
                ident, _, value = item.partition("=")
                try:
                    cache = int(ident)
                except ValueError:
                    raise Invalid(f"Missing '=' or non-numeric domain id '{ident}'") from None
                if cache not in CACHE_IDS:
                    raise Invalid(f"Unknown domain {cache}")
                if resource == "L3":
                    l3[cache] = _cbm(value)
                else:
                    mb[cache] = _bandwidth(value)
        group.l3, group.mb = l3, mb

    def _task(self, name: str, text: str) -> None:
        try:
            pid = int(text.strip())
        except ValueError:
            raise Invalid(f"bad task id {text.strip()!r}") from None
        if not os.path.exists(f"/proc/{pid}"):
            raise mfusepy.FuseOSError(errno.ESRCH)
        for g in self.groups.values():
            g.tasks.discard(pid)
        self.groups[name].tasks.add(pid)


def _cbm(value: str) -> int:
    try:
        mask = int(value, 16)
    except ValueError:
        raise Invalid(f"non-hex character in the mask {value}") from None
    if mask == 0 or mask >> CBM_BITS:
        raise Invalid(f"Mask out of range or empty: {value}")
    low = mask & -mask
    if (mask + low) & mask:  # the set bits are not one contiguous run
        raise Invalid(f"The mask {value} has non-consecutive 1-bits")
    if bin(mask).count("1") < MIN_CBM_BITS:
        raise Invalid(f"Need at least {MIN_CBM_BITS} bits in the mask")
    return mask


def _bandwidth(value: str) -> int:
    try:
        bw = int(value)
    except ValueError:
        raise Invalid(f"Non-decimal digit in MB value {value}") from None
    if not MB_MIN <= bw <= 100:
        raise Invalid(f"MB value {bw} out of range [{MB_MIN},100]")
    return -(-bw // MB_GRAN) * MB_GRAN


def main(mountpoint: str) -> None:
    mfusepy.FUSE(Resctrl(), mountpoint, foreground=True, nothreads=True, direct_io=True, fsname="resctrl")


if __name__ == "__main__":
    main(sys.argv[1])
