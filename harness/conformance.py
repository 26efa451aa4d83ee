"""CRI conformance (cri-tools' critest) directly against a private containerd, through the relay
and with cri-resmgr as the runtime's NRI plugin.

    python -m harness.conformance [--modes splice,grpc,nri] [--policy NAME] [--focus REGEX]

Each front end must pass exactly the specs that the runtime passes when called directly (nri:
critest calls the runtime directly, which hands every lifecycle event to our plugin): every
spec that passes direct and fails through a front end (or the other way round) is printed
and the exit status is 1, with the failure's message. A spec that fails on one side only is run
there RETRIES more times against a fresh runtime first: some specs race containerd itself, so it
is a difference only if it fails again, and is printed as flaky otherwise; a spec that fails again
is excused only where containerd's own log shows its removal race behind every failure. Specs listed in
tests/critest-skip.txt (with the reason) are skipped in every run. critest's images are served from
a loopback registry (harness.registry) built from local binaries, since nothing can be pulled
here. The runs go two at a time (--jobs), each against a containerd of its own: critest spends
most of its time waiting on containers, and specs that list every pod must not see another run's.
The specs that bind the host's ports (port forwarding and mapping, the host's network) run one
run at a time.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import images
from harness.containerd import PrivateContainerd, tool
from harness.registry import Base, Registry
from harness.relay import policy_nri, policy_relay

ROOT = Path(__file__).resolve().parents[1]
SKIP_FILE = ROOT / "tests" / "critest-skip.txt"
# Specs that listen on the host's network (fixed ports): two runs at once would take each other's.
HOST_PORTS = r"portforward|port mapping|HostNetwork"
# Runs again of a spec that failed on one side only before it counts as a difference.
RETRIES = 2
E2E = "registry.k8s.io/e2e-test-images/"
STAGING = "gcr.io/k8s-staging-cri-tools/"
# /etc/passwd and /etc/group for the users critest's image tests name.
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\n" \
         b"user1000:x:1000:1000::/:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
GROUP = b"root:x:0:\nwww-data:x:33:\nuser1000:x:1000:\ngroup50000:x:50000:user1000\nnogroup:x:65534:\n"


def serve_images(registry: Registry) -> None:
    """The images critest pulls, under the names it pulls them by."""
    archives = images.build_all()
    busybox, pause = Base.from_archive(archives[images.BUSYBOX_IMAGE]), Base.from_archive(archives[images.PAUSE_IMAGE])
    users = {"etc/passwd": PASSWD, "etc/group": GROUP}
    registry.add(E2E + "busybox:1.29-2", busybox, files=users)
    registry.add("registry.k8s.io/pause:3.9", pause)  # also served as k8s.gcr.io/pause:3.9
    # busybox's httpd stands in for nginx and httpd: a main page on port 80 (12003 on the host network).
    site = dict(users, **{"www/index.html": b"<html><body>cri-resmgr test page</body></html>\n"})
    for name in (E2E + "nginx:1.14-2", E2E + "httpd:2.4.39-4"):
        registry.add(name, busybox, files=site, Cmd=["/bin/httpd", "-f", "-p", "80", "-h", "/www"])
    registry.add(STAGING + f"hostnet-nginx-{images.PLATFORM.split('/')[1]}:latest", busybox, files=site,
                 Cmd=["/bin/httpd", "-f", "-p", "12003", "-h", "/www"])
    for name in ("test-image-latest:latest", "test-image-tag:test", "test-image-tag:all",
                 "test-image-tags:1", "test-image-tags:2", "test-image-tags:3"):
        registry.add(STAGING + name, busybox)  # the same image under every name
    for n in (1, 2, 3):  # different images
        registry.add(STAGING + f"test-image-{n}:latest", busybox, Labels={"variant": str(n)})
    registry.add(STAGING + "test-image-user-uid:latest", busybox, files=users, User="1002")
    registry.add(STAGING + "test-image-user-username:latest", busybox, files=users, User="www-data")
    registry.add(STAGING + "test-image-user-uid-group:latest", busybox, files=users, User="1003:1003")
    registry.add(STAGING + "test-image-user-username-group:latest", busybox, files=users, User="www-data:www-data")
    registry.add(STAGING + "test-image-predefined-group:latest", busybox, files=users, User="1000")


def skip_list() -> list[tuple[str, str]]:
    """(spec text, reason) pairs from tests/critest-skip.txt ("text  # reason" lines)."""
    out = []
    for line in SKIP_FILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            text, _, reason = line.partition("  # ")
            out.append((text.strip(), reason.strip()))
    return out


def run_critest(endpoint: str, report: Path, focus: str, skips: list[str], log: Path,
                skip_pattern: str = "") -> dict[str, str]:
    """Run critest against endpoint; returns spec -> state (passed, failed, skipped, ...)."""
    cmd = [tool("critest"), f"--runtime-endpoint=unix://{endpoint}", f"--image-endpoint=unix://{endpoint}",
           f"--ginkgo.json-report={report}", "--ginkgo.no-color", "--ginkgo.timeout=30m"]
    if focus:
        cmd.append(f"--ginkgo.focus={focus}")
    patterns = [re.escape(s) for s in skips] + ([skip_pattern] if skip_pattern else [])
    if patterns:
        cmd.append("--ginkgo.skip=" + "|".join(patterns))
    with open(log, "w") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=report.parent)
    return {name: spec["State"] for name, spec in specs(report)}


def specs(report: Path) -> list[tuple[str, dict]]:
    """(full spec text, spec report) for every It in a ginkgo JSON report."""
    out = []
    for suite in json.loads(report.read_text()):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") == "It":
                name = " ".join(spec.get("ContainerHierarchyTexts") or []) + " " + spec.get("LeafNodeText", "")
                out.append((name.strip(), spec))
    return out


def failures(here: Path) -> dict[str, str]:
    """spec -> "message (file:line)" for every failed spec in a run's reports."""
    out = {}
    for report in sorted(here.glob("critest*.json")):
        for name, spec in specs(report):
            failure = spec.get("Failure") or {}
            if failure:
                where = failure.get("Location") or {}
                at = f"{Path(where.get('FileName', '?')).name}:{where.get('LineNumber', '?')}"
                message = " ".join(str(failure.get("Message", "")).split())[:400]
                out[name] = f"{message} ({at})"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="splice,grpc,nri",
                    help="front ends to check: the relay's splice and grpc, and nri (default: %(default)s)")
    ap.add_argument("--policy", default="topology-aware", help="the relay's policy (default: %(default)s)")
    ap.add_argument("--focus", default="", help="run only specs matching this regular expression")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (reports, logs)")
    ap.add_argument("--jobs", type=int, default=2, help="critest runs at once (default: %(default)s)")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="crirm-critest-"))
    skips = skip_list()
    registry = Registry()
    serve_images(registry)
    url = registry.start()
    timings: dict[str, float] = {}

    targets = ["direct"] + [m for m in args.modes.split(",") if m]
    host_ports = threading.Lock()

    def run(target: str, focus: str = "", here: Path | None = None) -> dict[str, str]:
        started = time.monotonic()
        here = here or work / target
        here.mkdir()
        n = 80 + targets.index(target)
        ctrd = PrivateContainerd(here / "containerd", subnet=f"10.88.{n}.0/24", bridge=f"crirm{n}")
        relay = None
        try:
            ctrd.start()
            for host in ("registry.k8s.io", "k8s.gcr.io", "gcr.io"):
                ctrd.mirror(host, url)
            endpoint = ctrd.socket
            if target == "nri":
                relay = policy_nri(here, str(ctrd.dir / "nri.sock"), args.policy, "--config-socket", "disabled",
                                   "--hook-dir", "disabled", "--log-level", "INFO", relay_dir=here / "state").start()
            elif target != "direct":
                relay = policy_relay(here, ctrd.socket, args.policy, "--relay-mode", target, "--config-socket",
                                     "disabled", "--log-level", "INFO", relay_dir=here / "state").start()
                endpoint = relay.socket
            skipped = [s for s, _ in skips]
            if focus or args.jobs <= 1:
                return run_critest(endpoint, here / "critest.json", focus, skipped, here / "critest.log")
            found = run_critest(endpoint, here / "critest.json", "", skipped, here / "critest.log", HOST_PORTS)
            with host_ports:
                serial = run_critest(endpoint, here / "critest-host-ports.json", HOST_PORTS, skipped,
                                     here / "critest-host-ports.log")
            # Specs the first run skipped for their ports are what the second one says.
            return {**found, **{k: v for k, v in serial.items() if v != "skipped" or k not in found}}
        finally:
            if relay is not None:
                relay.stop(timeout=30)
            ctrd.stop()
            timings[target] = timings.get(target, 0.0) + time.monotonic() - started

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {t: pool.submit(run, t, args.focus) for t in targets}
            results = {t: f.result() for t, f in futures.items()}
        flaky = retry_differences(results, run, work)
    finally:
        registry.stop()
    return report(results, flaky, timings, skips, work, args.keep)


def differences(results: dict[str, dict[str, str]]) -> dict[str, set[str]]:
    """target -> specs that failed there although another side passed them (direct vs each front end)."""
    passed = {t: {s for s, st in res.items() if st == "passed"} for t, res in results.items()}
    out: dict[str, set[str]] = {t: set() for t in results}
    for target in results:
        if target != "direct":
            out[target] |= passed["direct"] - passed[target]
            out["direct"] |= passed[target] - passed["direct"]
    return {t: specs for t, specs in out.items() if specs}


def retry_differences(results: dict[str, dict[str, str]], run: Callable[[str, str, Path], dict[str, str]],
                      work: Path) -> dict[str, dict[str, str]]:
    """Run every spec that failed on one side only RETRIES more times there, against a fresh runtime.

    Some critest specs race the runtime itself, so one failure is not yet a difference. A spec that
    passes on every retry is reported as flaky with its first failure. One that fails again stays a
    difference, unless every one of its failures is containerd's own removal race, confirmed in
    that run's containerd log (see removal_race). Returns target -> spec -> what to print for the
    excused ones, and updates results.
    """
    excused: dict[str, dict[str, str]] = {}
    for target, names in sorted(differences(results).items()):
        first = failures(work / target)
        tries = [(work / target, {n: first.get(n, results[target].get(n, "?")) for n in names})]
        focus = "|".join(re.escape(n) for n in sorted(names))
        for attempt in range(1, RETRIES + 1):
            here = work / f"{target}.retry{attempt}"
            again = run(target, focus, here)
            why = failures(here)
            tries.append((here, {n: why.get(n, again.get(n, "?")) for n in names if again.get(n) != "passed"}))
        for name in names:
            failed = [(here, why[name]) for here, why in tries if name in why]
            causes = [removal_race(here / "containerd" / "containerd.log", why) for here, why in failed]
            if len(failed) == 1:
                excused.setdefault(target, {})[name] = f"failed once, passed {RETRIES} retries\n      {failed[0][1]}"
            elif all(causes):
                excused.setdefault(target, {})[name] = (
                    f"failed {len(failed)} of {RETRIES + 1} runs, every time on containerd's own removal race\n"
                    f"      {causes[0]}")
            else:
                continue
            results[target][name] = "passed"
    return excused


# containerd's RemoveContainer on a container that exits by itself: stopContainer finds the task
# already deleted by the exit handler and returns at once, before that handler has marked the
# container exited, so setting "removing" fails. Its own log then shows no kill for the container.
REMOVAL_RACE = re.compile(r'failed to set removing state for container \\?"([0-9a-f]{64})\\?": '
                          r"container is still running, to stop first")


def removal_race(log: Path, failure: str) -> str:
    """The evidence that failure is containerd's removal race, from its log; "" if it is not."""
    m = REMOVAL_RACE.search(failure)
    if not m or not log.exists():
        return ""
    cid = m.group(1)
    stopping = killed = False
    for line in log.read_text(errors="replace").splitlines():
        if cid not in line:
            continue
        if "Forcibly stopping container" in line:
            stopping, killed = True, False
        elif "Kill container" in line:
            killed = True
        elif f'RemoveContainer for \\"{cid}\\" failed' in line and "to stop first" in line:
            if stopping and not killed:
                return (f"container {cid[:12]}: containerd found its task gone and sent no kill, "
                        "then refused the removal as still running (its exit not yet recorded)")
            stopping = False
    return ""


def report(results: dict[str, dict[str, str]], flaky: dict[str, dict[str, str]], timings: dict[str, float],
           skips: list[tuple[str, str]], work: Path, keep: bool) -> int:
    direct = results["direct"]
    passed = {s for s, st in direct.items() if st == "passed"}
    print(f"critest {len(direct)} specs; skipped by tests/critest-skip.txt: {len(skips)} entries")
    ok = True
    for target, res in results.items():
        states: dict[str, int] = {}
        for st in res.values():
            states[st] = states.get(st, 0) + 1
        mine = {s for s, st in res.items() if st == "passed"}
        line = ", ".join(f"{n} {st}" for st, n in sorted(states.items()))
        print(f"  {target:7s} {line}  ({timings[target]:.0f} s)")
        for spec, why in sorted(flaky.get(target, {}).items()):
            print(f"    flaky {target}: {spec}: {why}")
        if target == "direct":
            continue
        why = failures(work / target) if passed - mine else {}
        for spec in sorted(passed - mine):
            ok = False
            print(f"    passes direct, not through {target}: {spec}")
            if spec in why:
                print(f"      {why[spec]}")
        for spec in sorted(mine - passed):
            ok = False
            print(f"    passes through {target}, not direct: {spec}")
    for spec, st in sorted(direct.items()):
        if st not in ("passed", "skipped", "pending"):
            print(f"  fails direct too ({st}): {spec}")
    print("critest through every front end " + ("equals critest direct" if ok else "DIFFERS from critest direct"))
    if keep or not ok:
        print(f"reports and logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
