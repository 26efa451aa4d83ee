#!/usr/bin/env python3
"""The agent's HTTP/2 client against httpx (with h2), the well-kept asyncio HTTP/2 library it
could use instead, on a real kube-apiserver: memory, CPU per request, and requests lost to the API
server's GOAWAYs.

Each client runs in a process of its own (so imports and pools are its own): RSS before and after
importing it and after its first request; then N GETs of a ConfigMap, one at a time and 16 at a
time on one connection, with the process's CPU time per request; then the same with the API
server sending GOAWAY on a share of its HTTP/2 requests (`--goaway-chance`, as production API
servers behind load balancers are run), counting the requests that failed. httpx is installed for
this benchmark only, under ~/.cache/cri-resmgr/bench-httpx (PyPI).

    python benchmarks/apiclient.py [--requests 2000] [--goaway-chance 0.02]
    python benchmarks/apiclient.py --rounds 10   # the own client's RSS over 10 x 1000 GETs with GOAWAYs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HTTPX = Path.home() / ".cache" / "cri-resmgr" / "bench-httpx"
PATH = "/api/v1/namespaces/default/configmaps/bench"

CHILD = r'''
import asyncio, json, resource, sys, time
sys.path.insert(0, sys.argv[4])
sys.path.insert(0, sys.argv[5])

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

kind, kubeconfig, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {"rss_start": rss()}
if kind == "own":
    from resmgr.agent.apiclient import Client, load_kubeconfig
else:
    import httpx, ssl
    from resmgr.agent.apiclient import load_kubeconfig
out["rss_imported"] = rss()

async def main():
    creds = load_kubeconfig(kubeconfig)
    if kind == "own":
        client = Client(creds)
        async def get():
            await client.request("GET", sys.argv[6])
        close = client.close
    else:
        client = httpx.AsyncClient(http2=True, verify=creds.ssl_context(), base_url=creds.server,
                                   limits=httpx.Limits(max_connections=1))
        async def get():
            r = await client.get(sys.argv[6], headers={"accept": "application/json"})
            r.raise_for_status()
            r.json()
        close = client.aclose
    for _ in range(5):  # the first may meet a GOAWAY too
        try:
            await get()
            break
        except Exception:
            pass
    out["rss_first"] = rss()
    for name, width in (("serial", 1), ("16 at once", 16)):
        failed = 0
        cpu = time.process_time()
        began = time.monotonic()
        async def worker(n):
            nonlocal failed
            for _ in range(n):
                try:
                    await get()
                except Exception as err:
                    failed += 1
                    out.setdefault("errors", {}).setdefault(f"{type(err).__name__}: {err}"[:120], 0)
                    out["errors"][f"{type(err).__name__}: {err}"[:120]] += 1
        await asyncio.gather(*(worker(count // width) for _ in range(width)))
        out[name] = {"cpu_ms_per_request": 1000 * (time.process_time() - cpu) / count,
                     "requests_per_s": count / (time.monotonic() - began), "failed": failed}
    out["rss_end"] = rss()
    await close()

asyncio.run(main())
print(json.dumps(out))
'''


ROUNDS = r'''
import asyncio, gc, sys
sys.path.insert(0, sys.argv[3])
from resmgr.agent.apiclient import Client, load_kubeconfig, _H2

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

async def main():
    client = Client(load_kubeconfig(sys.argv[1]))
    for r in range(int(sys.argv[2])):
        failed = 0
        for _ in range(1000):
            try:
                await client.request("GET", sys.argv[4])
            except Exception:
                failed += 1
        gc.collect()
        alive = sum(1 for o in gc.get_objects() if isinstance(o, _H2) and not o.closed)
        print(f"after {1000 * (r + 1):>6} GETs: RSS {rss():5.1f} MB, connections open {alive}, failed {failed}",
              flush=True)
    await client.close()

asyncio.run(main())
'''


def rounds(count: int, goaway: float) -> None:
    """The own client's RSS, round after round of GETs, as GOAWAYs make it reconnect."""
    from harness.kube import ControlPlane
    control = ControlPlane(Path(tempfile.mkdtemp(prefix="crirm-bench-api-")))
    control.apiserver.args.append(f"--goaway-chance={goaway}")
    control.start()
    try:
        control.core().create_namespaced_config_map("default", {"metadata": {"name": "bench"},
                                                                "data": {"k": "v" * 512}})
        print(f"the own client, GETs of a ConfigMap one at a time, GOAWAY on {goaway:.0%} of requests:")
        subprocess.run([sys.executable, "-c", ROUNDS, str(control.admin_kubeconfig), str(count), str(ROOT), PATH],
                       check=True, timeout=1800)
    finally:
        control.stop()


def httpx_path() -> Path:
    if not (HTTPX / "httpx").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(HTTPX), "httpx[http2]"],
                       check=True)
    return HTTPX


def measure(kind: str, kubeconfig: Path, count: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(kubeconfig), str(count), str(ROOT),
                          str(httpx_path()), PATH], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{kind}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--goaway-chance", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=0, help="only the own client's RSS over this many rounds "
                                                              "of 1000 GETs with GOAWAYs")
    args = parser.parse_args()
    if args.rounds:
        rounds(args.rounds, args.goaway_chance)
        return
    from harness.kube import ControlPlane

    results: dict[str, dict[str, dict]] = {}
    for goaway in (0.0, args.goaway_chance):
        control = ControlPlane(Path(tempfile.mkdtemp(prefix="crirm-bench-api-")))
        if goaway:
            control.apiserver.args.append(f"--goaway-chance={goaway}")
        control.start()
        try:
            control.core().create_namespaced_config_map("default", {"metadata": {"name": "bench"},
                                                                    "data": {"k": "v" * 512}})
            for kind in ("own", "httpx"):
                results.setdefault(kind, {})[f"goaway {goaway:g}"] = measure(kind, control.admin_kubeconfig,
                                                                             args.requests)
        finally:
            control.stop()
    for kind, runs in results.items():
        for label, r in runs.items():
            for error, n in sorted((r.get("errors") or {}).items(), key=lambda e: -e[1])[:3]:
                print(f"  {kind}, {label}: {n} x {error}")
    print(f"{args.requests} GETs of a ConfigMap on one HTTP/2 connection, a real kube-apiserver")
    print(f"{'client':8} {'GOAWAY':>7} {'RSS start/imported/first/end MB':>34} {'serial ms CPU/req':>18} "
          f"{'16x ms CPU/req':>15} {'req/s 16x':>10} {'failed':>7}")
    for kind, runs in results.items():
        for label, r in runs.items():
            rss = "/".join(f"{r[k]:.1f}" for k in ("rss_start", "rss_imported", "rss_first", "rss_end"))
            print(f"{kind:8} {label.split()[1]:>7} {rss:>34} {r['serial']['cpu_ms_per_request']:>18.3f} "
                  f"{r['16 at once']['cpu_ms_per_request']:>15.3f} {r['16 at once']['requests_per_s']:>10.0f} "
                  f"{r['serial']['failed'] + r['16 at once']['failed']:>7}")


if __name__ == "__main__":
    main()
