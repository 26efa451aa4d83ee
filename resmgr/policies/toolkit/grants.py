"""Grant bookkeeping: what each container holds, the CPUs held exclusively, and undo.

A Grant is one container's share of a policy's CPUs: CPUs of its own (isolated, or sliced
off a pool's shared CPUs), a share of a pool's shared CPUs, or the reserved CPUs, and the
memory it is accounted for. Grants keeps them by container key with the union of exclusive
CPUs, tells the policy of every change (its own accounting: per-pool counters), and undoes
every change made inside a failed `transaction()`, so a request that cannot be met leaves
the policy exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType

DEFAULT_MEMORY = frozenset({MemoryType.DRAM, MemoryType.PMEM})


@dataclass(frozen=True)
class Grant:
    pool: str  # the pool it belongs to ("" for exclusive CPUs of no pool)
    exclusive: CPUSet = EMPTY  # CPUs of its own
    shared: int = 0  # milli-CPU taken from its pool's shared capacity
    on_shared: bool = False  # runs on its pool's shared CPUs (shared or mixed grant)
    reserved: bool = False  # runs on the reserved CPUs
    milli: int = 0  # its whole CPU request
    memory: int = 0  # bytes accounted against its memory pool
    mem_types: frozenset[MemoryType] = DEFAULT_MEMORY
    mem_pool: str = ""  # whose memory nodes it uses, when not its pool's (moved up for room)
    hide_ht: bool = False  # runs on one thread of each core
    claim: str = ""  # the DRA claim (UID) whose CPUs it runs on (a claim's own grant: "")
    pin_cpu: bool = True  # False: its CPUs are left as they are (cpu.preserve), though the grant counts
    pin_memory: bool = True  # False: its memory nodes are left as they are (memory.preserve)
    cold: bool = False  # a cold start: its memory on the PMEM nodes only, until the policy warms it
    irq_claim: tuple[str, ...] = ()  # interrupts (globs) its exclusive CPUs handle
    irq_mask: tuple[str, ...] = ()  # interrupts (globs) kept off its exclusive CPUs
    irq_claim_first: bool = False  # its masks win over claims (irq-affinity mode claim-first)

    @property
    def memory_pool(self) -> str:
        return self.mem_pool or self.pool

    @property
    def kind(self) -> str:
        if self.claim:
            return "claim"
        if self.reserved:
            return "reserved"
        if self.exclusive:
            return "mixed" if self.on_shared else "exclusive"
        return "shared"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pool": self.pool, "exclusive": str(self.exclusive), "milli": self.milli,
                             "shared": self.shared, "on_shared": self.on_shared}
        for name, value, default in (("reserved", self.reserved, False), ("memory", self.memory, 0),
                                     ("mem_pool", self.mem_pool, ""), ("hide_ht", self.hide_ht, False),
                                     ("claim", self.claim, ""), ("pin_cpu", self.pin_cpu, True),
                                     ("pin_memory", self.pin_memory, True), ("cold", self.cold, False),
                                     ("irq_claim", list(self.irq_claim), []), ("irq_mask", list(self.irq_mask), []),
                                     ("irq_claim_first", self.irq_claim_first, False)):
            if value != default:
                d[name] = value
        if self.mem_types != DEFAULT_MEMORY:
            d["mem_types"] = sorted(t.value for t in self.mem_types)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Grant:
        """A persisted grant; also the older forms (static's {pool, exclusive, milli})."""
        pool, exclusive, milli = str(d["pool"]), CPUSet.parse(str(d.get("exclusive", ""))), int(d.get("milli", 0))
        if "on_shared" in d:
            on_shared, shared = bool(d["on_shared"]), int(d.get("shared", 0))
        else:  # a shared pool named means it runs there, for what its exclusive CPUs do not cover
            on_shared, shared = bool(pool), max(milli - 1000 * len(exclusive), 0) if pool else 0
        types = d.get("mem_types")
        return cls(pool, exclusive, shared, on_shared, bool(d.get("reserved", False)),
                   milli or shared + 1000 * len(exclusive), int(d.get("memory", 0)),
                   frozenset(MemoryType(t) for t in types) if types else DEFAULT_MEMORY,
                   str(d.get("mem_pool", "")), bool(d.get("hide_ht", False)), str(d.get("claim", "")),
                   bool(d.get("pin_cpu", True)), bool(d.get("pin_memory", True)), bool(d.get("cold", False)),
                   tuple(map(str, d.get("irq_claim") or ())), tuple(map(str, d.get("irq_mask") or ())),
                   bool(d.get("irq_claim_first", False)))


Change = Callable[[str, Grant, int], None]


class Grants:
    """Grants by container key. on_change(key, grant, +1 | -1) is called after every add and
    removal (taken already updated), for the policy's own accounting."""

    def __init__(self, on_change: Change | None = None) -> None:
        self._by_key: dict[str, Grant] = {}
        self.taken = EMPTY  # every CPU held exclusively (grants never overlap)
        self.on_change = on_change
        self._journal: list[tuple[str, Grant | None]] | None = None

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Grants):
            return self._by_key == other._by_key
        if isinstance(other, Mapping):
            return self._by_key == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def get(self, key: str) -> Grant | None:
        return self._by_key.get(key)

    def __getitem__(self, key: str) -> Grant:
        return self._by_key[key]

    def items(self) -> list[tuple[str, Grant]]:
        return list(self._by_key.items())

    def values(self) -> list[Grant]:
        return list(self._by_key.values())

    def as_dict(self) -> dict[str, Grant]:
        return dict(self._by_key)

    def add(self, key: str, grant: Grant) -> None:
        """Record a grant (replacing the key's old one)."""
        self.remove(key)
        if self._journal is not None:
            self._journal.append((key, None))
        self._by_key[key] = grant
        self.taken |= grant.exclusive
        if self.on_change is not None:
            self.on_change(key, grant, 1)

    def remove(self, key: str) -> Grant | None:
        grant = self._by_key.get(key)
        if grant is None:
            return None
        if self._journal is not None:
            self._journal.append((key, grant))
        del self._by_key[key]
        self.taken -= grant.exclusive
        if self.on_change is not None:
            self.on_change(key, grant, -1)
        return grant

    def rename(self, old: str, new: str) -> None:
        grant = self.remove(old)
        if grant is not None:
            self.add(new, grant)

    def clear(self) -> None:
        for key in list(self._by_key):
            self.remove(key)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Undo every add and remove made inside when it raises (nested: the outermost undoes)."""
        if self._journal is not None:
            yield
            return
        self._journal = []
        try:
            yield
        except BaseException:
            journal, self._journal = self._journal, None
            for key, before in reversed(journal):
                if before is None:
                    self.remove(key)
                else:
                    self.add(key, before)
            raise
        finally:
            self._journal = None
