"""Figures of a soak: how each fault went, the violations, and whether the daemons' memory and file
descriptors stay flat (a least-squares slope within each process's life, after its warm-up, pooled
over its restarts)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from resmgr.topology.cpuset import CPUSet


@dataclass
class Strike:
    """One fault: when it struck, when its cause was taken away, when the node was whole again."""

    kind: str
    started: float  # monotonic
    recovered: float = 0.0
    recovered_guest: float = 0.0  # the same moment by the guest's clock
    whole: float = 0.0  # 0: not within the bound
    notes: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)  # why it was not whole at the last look

    @property
    def to_whole(self) -> float | None:
        return self.whole - self.recovered if self.whole else None


def slope(samples: list[tuple[float, int, float]], warm: float, since: float) -> tuple[float, int]:
    """(units per hour, samples used) of value over time, within each process (pid) from warm seconds
    after its first sample and from since on; the within-process slopes pooled."""
    lives: dict[int, list[tuple[float, float]]] = {}
    for t, pid, value in samples:
        lives.setdefault(pid, []).append((t, value))
    num = den = 0.0
    used = 0
    for points in lives.values():
        first = points[0][0]
        kept = [(t, v) for t, v in points if t >= first + warm and t >= since]
        if len(kept) < 3:
            continue
        mt = statistics.fmean(t for t, _ in kept)
        mv = statistics.fmean(v for _, v in kept)
        num += sum((t - mt) * (v - mv) for t, v in kept)
        den += sum((t - mt) ** 2 for t, _ in kept)
        used += len(kept)
    return (num / den * 3600 if den else 0.0), used


def placements_kept(before: dict[tuple[str, str], str], after: dict[tuple[str, str], str]) -> dict[str, Any]:
    """Guaranteed containers' CPUs (by pod and container name) before a reboot and after it: kept of
    those whose pod lived through it (the churn makes pods meanwhile and spares those of before),
    and what moved.
    One that came back on more CPUs including all it had kept them (its pod was resized: kubelet
    makes the container anew at its new size)."""
    lived = [k for k in before if k in after]
    moved = [k for k in lived if not CPUSet.parse(after[k]) >= CPUSet.parse(before[k])]
    notes: dict[str, Any] = {"placements kept": f"{len(lived) - len(moved)} of {len(lived)}"}

    def changes(keys: list[tuple[str, str]]) -> list[str]:
        return [f"{pod}/{ctr} {before[(pod, ctr)]} -> {after[(pod, ctr)]}" for pod, ctr in keys]

    def holders(key: tuple[str, str]) -> str:
        """Who runs on the CPUs it left: a pod new since the reboot may take them (docs/limitations.md)."""
        left = CPUSet.parse(before[key]) - CPUSet.parse(after[key])
        names = [f"{p}/{c}" + ("" if (p, c) in before else " (new)") for (p, c), cpus in sorted(after.items())
                 if (p, c) != key and CPUSet.parse(cpus) & left]
        return ", ".join(names) or "no Guaranteed container"

    if moved:
        notes["placements moved"] = [f"{text}: its CPUs held by {holders(k)}" for k, text in zip(moved, changes(moved),
                                                                                                strict=True)]
    if grown := [k for k in lived if after[k] != before[k] and k not in moved]:
        notes["grown where they were"] = changes(grown)
    if len(lived) < len(before):
        notes["pods not through the reboot"] = len(before) - len(lived)
    return notes


def fault_table(strikes: list[Strike]) -> list[dict[str, Any]]:
    kinds: dict[str, list[Strike]] = {}
    for s in strikes:
        kinds.setdefault(s.kind, []).append(s)
    rows = []
    for kind, got in kinds.items():
        times = [s.to_whole for s in got if s.to_whole is not None]
        rows.append({"fault": kind, "struck": len(got), "whole": len(times),
                     "longest_to_whole_s": round(max(times), 1) if times else None,
                     "median_to_whole_s": round(statistics.median(times), 1) if times else None,
                     "never_whole": [s.reasons[:3] for s in got if s.to_whole is None]})
    return rows


def text(report: dict[str, Any]) -> str:
    """The report for a person."""
    lines = [f"soak ({report['mode']} mode, {report['duration_s'] / 60:.0f} min, seed {report['seed']}): "
             f"{report['pods']['made']} pods made, {report['pods']['deleted']} deleted, "
             f"{report['pods']['resized']} resized, {len(report['config_changes'])} configuration changes",
             f"pods of DRA claims: {report['pods'].get('claiming', 0)} made, {report['pods'].get('claiming_ran', 0)} "
             f"ran, {report['pods'].get('claiming_unplaced', 0)} given up unplaced by kube-scheduler",
             "", f"{'fault':22} {'struck':>6} {'whole':>6} {'longest s':>10} {'median s':>9}"]
    for row in report["faults"]:
        lines.append(f"{row['fault']:22} {row['struck']:6} {row['whole']:6} "
                     f"{row['longest_to_whole_s'] if row['longest_to_whole_s'] is not None else '-':>10} "
                     f"{row['median_to_whole_s'] if row['median_to_whole_s'] is not None else '-':>9}")
    lines += ["", f"violations: {sum(report['violations'].values())} {report['violations'] or ''}"]
    for v in report["violation_examples"]:
        lines.append(f"  {v}")
    if report.get("daemon_said"):
        lines.append("what cri-resmgr warned of around them:")
        lines += [f"  {line}" for line in report["daemon_said"]]
    if report.get("evidence"):
        lines.append("what the journals say of the pods, claims or containers of the violations:")
        lines += [f"  {line}" for line in report["evidence"]]
    lines.append(f"planted by the soak: {len(report.get('planted', []))}")
    lines += [f"  {p}" for p in report.get("planted", [])]
    if report.get("nri_window"):
        lines.append(f"set apart, made without the NRI plugin (containerd issue 11217): {len(report['nri_window'])}")
        lines += [f"  {v}" for v in report["nri_window"][:10]]
    if report.get("refused"):
        lines.append(f"set apart, left where they were while containerd stalled on their update: "
                     f"{len(report['refused'])}")
        lines += [f"  {v}" for v in report["refused"][:10]]
    lines.append("")
    for name, fig in report["slopes"].items():
        lines.append(f"{name:11} RSS {fig['rss_mb_per_h']:+.2f} MB/h ({fig['rss_samples']} samples; last "
                     f"{fig['rss_last_mb']:.1f} MB), open fds {fig['fds_per_h']:+.2f}/h (last {fig['fds_last']})")
    lines.append(f"state directory: at most {report['state_max_bytes']} bytes")
    for key, value in report["notes"].items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)
