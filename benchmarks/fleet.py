#!/usr/bin/env python3
"""A fleet of node agents on one API server: how long a configuration takes to reach every node
and be reported, and what it costs the API server.

A real kube-apiserver and etcd (harness/kube.py) with the chart's CRDs and RBAC; N Node objects;
N agents - the agent's own code for watching, choosing, pushing and reporting (NodeAgent), each
with its own API connection and the chart's ServiceAccount token - run in a few worker processes
(the agent is asyncio without threads, so one process holds hundreds); one stand-in cri-resmgr
that serves the real config link on one socket for all of them and judges each pushed
configuration with cri-resmgr's own validation; and the tally (`cri-resmgr-agent tally`, a
process of its own, with its own ServiceAccount). Requests are counted from the API server's
audit log.

Scenarios: the fleet starting; `default` changed; a group's resource changed; a bad `default`
rejected by every node; 5% of the agents restarted; the API server restarted (then a change);
the fleet at rest. For each: when each node had applied it and written its status (p50/p99/last),
when the tally's counts said so, requests per node by verb, 409 and 429 answers, the bytes the
tally wrote to shared objects and the watch events the agents received, the API server's CPU
and memory. At rest: requests per node per minute, the agents' CPU and memory per node, and one
real agent process's memory.

    python benchmarks/fleet.py [--nodes 1000] [--workers 2] [--idle 120]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers, run from anywhere

from resmgr.agent import resources as rs  # noqa: E402

NS = "kube-system"
GROUP_LABEL = "cri-resource-manager.intel.com/group"
AGENT_USER = f"system:serviceaccount:{NS}:cri-resmgr-agent"
TALLY_USER = f"system:serviceaccount:{NS}:cri-resmgr-tally"
HERE = Path(__file__).resolve()


# -- the stand-in cri-resmgr: the real config link, cri-resmgr's own validation -------------------
def standin(socket: str) -> None:
    import grpc

    from resmgr.config.document import ConfigError, from_map
    from resmgr.generated.config import api_pb2, api_pb2_grpc

    judged: dict[tuple[tuple[str, str], ...], str] = {}  # the same data judged once: a pure function

    class Config(api_pb2_grpc.ConfigServicer):
        async def SetConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
            data = dict(request.config)
            key = tuple(sorted(data.items()))
            if key not in judged:
                try:
                    from_map(data, "ConfigMap data for node NODE")
                    judged[key] = ""
                except ConfigError as err:
                    judged[key] = str(err)
            return api_pb2.SetConfigReply(error=judged[key].replace("node NODE", f"node {request.node_name}"))

    async def serve() -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_ConfigServicer_to_server(Config(), server)
        server.add_insecure_port("unix://" + socket)
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


# -- a worker: many agents in one process --------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    from resmgr.agent import apiclient
    from resmgr.agent.agent import NodeAgent, Settings

    received = [0]  # bytes of watch events
    lines = apiclient.Response.lines

    async def counted(self: apiclient.Response) -> Any:
        async for line in lines(self):
            received[0] += len(line) + 1
            yield line
    apiclient.Response.lines = counted  # type: ignore[method-assign]

    failed_writes = [0]
    record = NodeAgent._record

    async def recorded(self: NodeAgent, choice: Any, error: str) -> bool:
        ok = await record(self, choice, error)
        failed_writes[0] += not ok
        print(json.dumps({"node": self.settings.node_name, "name": choice.name, "version": choice.version,
                          "rejected": bool(error), "ok": ok, "t": time.time()}), flush=True)
        return ok
    NodeAgent._record = recorded  # type: ignore[method-assign]

    token = Path(args.token_file).read_text().strip()

    async def run() -> None:
        agents: dict[str, tuple[NodeAgent, asyncio.Task[None], apiclient.Client]] = {}

        def start(name: str) -> None:
            api = apiclient.Client(apiclient.Credentials(server=args.server, ca_file=args.ca, token=token))
            agent = NodeAgent(Settings(node_name=name, config_namespace=NS, config_socket=args.socket), api)
            agents[name] = (agent, asyncio.create_task(agent.run()), api)

        for name in args.names.split(","):
            start(name)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := (await reader.readline()).decode().split():
            if line[0] == "restart":  # as a pod killed and started again: nothing kept
                for name in line[1:]:
                    agent, task, api = agents.pop(name)
                    task.cancel()
                    await api.close()
                    start(name)
            elif line[0] == "stats":
                usage = resource.getrusage(resource.RUSAGE_SELF)
                unhealthy = sum(1 for a, _, _ in agents.values() if a.health())
                print(json.dumps({"stats": True, "rss": rss_kib(os.getpid()), "cpu": usage.ru_utime + usage.ru_stime,
                                  "received": received[0], "unhealthy": unhealthy,
                                  "failed_writes": failed_writes[0]}), flush=True)
            elif line[0] == "quit":
                break
        for _, task, api in agents.values():
            task.cancel()
            await api.close()

    asyncio.run(run())


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the coordinator -----------------------------------------------------------------------------
class Workers:
    def __init__(self, cmds: list[list[str]], log_dir: Path) -> None:
        self.procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=open(log_dir / f"worker-{i}.log", "wb"), text=True)
                      for i, c in enumerate(cmds)]
        self.records: list[dict[str, Any]] = []
        self.stats: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.stats_seen = threading.Condition(self.lock)
        for i, p in enumerate(self.procs):
            threading.Thread(target=self._read, args=(i, p), daemon=True).start()

    def _read(self, i: int, p: subprocess.Popen) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            doc = json.loads(line)
            with self.lock:
                if doc.get("stats"):
                    self.stats[i] = doc
                    self.stats_seen.notify_all()
                else:
                    self.records.append(doc)

    def send(self, i: int, command: str) -> None:
        assert self.procs[i].stdin is not None
        self.procs[i].stdin.write(command + "\n")
        self.procs[i].stdin.flush()

    def gather(self) -> dict[str, Any]:
        with self.lock:
            self.stats.clear()
        for i in range(len(self.procs)):
            self.send(i, "stats")
        with self.lock:
            self.stats_seen.wait_for(lambda: len(self.stats) == len(self.procs), 30)
            return {k: sum(s[k] for s in self.stats.values())
                    for k in ("rss", "cpu", "received", "unhealthy", "failed_writes")}

    def stop(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is None:
                self.send(i, "quit")
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


class Audit:
    """The audit log read on from where it was last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def since(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind("\n") + 1
        self.offset += len(data[:end].encode())
        return [json.loads(line) for line in data[:end].splitlines() if line]


def once(record: dict[str, Any]) -> bool:
    """A request once: a watch when it started (it is logged again when it ends), others when answered."""
    if record["verb"] == "watch":
        return record.get("stage") == "ResponseStarted"
    return record.get("stage") == "ResponseComplete"


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from harness.kube import ControlPlane
        from tests.support.agentenv import install_agent_rbac, install_crds

        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="crirm-fleet-"))
        self.control = ControlPlane(self.work / "k8s").start()
        install_agent_rbac(self.control)
        install_crds(self.control)
        self.audit = Audit(self.control.audit_log)
        from kubernetes import client
        self.client = client
        self.custom = client.CustomObjectsApi(self.control.api_client())
        self.nodes = [f"fleet-{i:05}" for i in range(args.nodes)]
        self.group = set(self.nodes[:max(1, int(args.nodes * args.group_share))])
        self.rows: list[tuple[str, dict[str, Any]]] = []
        self.procs: list[subprocess.Popen] = []

    # -- setup --
    def make_nodes(self) -> None:
        core = self.control.core()

        def make(name: str) -> None:
            labels = {"kubernetes.io/hostname": name, **({GROUP_LABEL: "g1"} if name in self.group else {})}
            core.create_node(self.client.V1Node(metadata=self.client.V1ObjectMeta(name=name, labels=labels)))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(make, [*self.nodes, "fleet-solo"]))

    def resource(self, name: str, spec: dict[str, Any]) -> None:
        args = (rs.GROUP, rs.VERSION, NS, rs.PLURAL)
        body = {"apiVersion": f"{rs.GROUP}/{rs.VERSION}", "kind": rs.KIND, "metadata": {"name": name}, "spec": spec}
        try:
            self.custom.create_namespaced_custom_object(*args, body)
        except self.client.ApiException as err:
            if err.status != 409:
                raise
            # The spec replaced by a JSON patch: no precondition to conflict with the tally's writes.
            self.custom.patch_namespaced_custom_object(*args, name, [{"op": "replace", "path": "/spec",
                                                                      "value": spec}],
                                                       _content_type="application/json-patch+json")

    def config_status(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, name)
        return {"generation": obj["metadata"]["generation"], **(obj.get("status") or {})}

    def spawn(self, *cmd: str, log: str) -> subprocess.Popen:
        p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=open(self.work / log, "wb"), text=True)
        self.procs.append(p)
        return p

    # -- a scenario --
    def scenario(self, title: str, action: Any, nodes: list[str], config: str, rejected: bool = False,
                 counts: tuple[int, int] | None = None, timeout: float = 300) -> None:
        self.audit.since()
        server_cpu, stats0 = cpu_seconds(self.apiserver_pid()), self.workers.gather()
        t0 = time.time()
        action()
        version = str(self.config_status(config)["generation"]) if config else ""
        deadline = time.time() + timeout
        seen = self.reported(t0, nodes, deadline, lambda r: r["t"] >= t0 and r["rejected"] == rejected and (
            not config or (r["name"] == config and r["version"] == version)))
        tallied = self.wait_counts(config, counts, t0, deadline) if counts is not None else float("nan")
        time.sleep(2)  # the tally's last write and the watch events it sends
        self.finish(title, t0, nodes, seen, tallied, server_cpu, stats0)

    def reported(self, t0: float, nodes: list[str], deadline: float, match: Any) -> dict[str, float]:
        """Each node's first successfully recorded outcome that matches, seconds after t0, as the
        workers report them (until all nodes have one, or the deadline)."""
        want, seen = set(nodes), {}
        while time.time() < deadline and len(seen) < len(want):
            with self.workers.lock:
                for r in self.workers.records:
                    if r["ok"] and r["node"] in want and r["node"] not in seen and match(r):
                        seen[r["node"]] = r["t"] - t0
            time.sleep(0.2)
        return seen

    def apiserver_pid(self) -> int:
        assert self.control.apiserver.proc is not None
        # setpriv execs the server in the same process
        return self.control.apiserver.proc.pid

    def finish(self, title: str, t0: float, nodes: list[str], seen: dict[str, float], tallied: float,
               server_cpu: float, stats0: dict[str, Any]) -> None:
        stats = self.workers.gather()
        records = self.audit.since()
        by_verb: collections.Counter[str] = collections.Counter()
        codes: collections.Counter[int] = collections.Counter()
        tally_writes = tally_bytes = accepted = 0
        for r in records:
            if not once(r):
                continue
            user = r.get("user", {}).get("username")
            code = (r.get("responseStatus") or {}).get("code", 0)
            if user == AGENT_USER:
                by_verb[r["verb"]] += 1
                codes[code] += 1
                accepted += code < 400 and r["verb"] in ("create", "patch", "update")
            elif user == TALLY_USER and r["verb"] == "patch":
                tally_writes += 1
        if tally_writes:
            tally_bytes = tally_writes * len(json.dumps(self.config_status("default")))
        lat = list(seen.values())
        n = len(nodes)
        row = {
            "nodes": f"{len(seen)}/{n}",
            "p50": pct(lat, 50), "p99": pct(lat, 99), "last": max(lat) if lat else float("nan"),
            "tallied": tallied,
            "req/node": sum(by_verb.values()) / n,
            "writes/node": accepted / n,  # those the server took; refused ones (429) are counted apart
            "verbs": dict(by_verb), "409": codes[409], "429": codes[429], "5xx": sum(c for k, c in codes.items()
                                                                                     if k >= 500),
            "tally writes": tally_writes, "tally bytes": tally_bytes,
            "watch MB": (stats["received"] - stats0["received"]) / 1e6,
            "server cpu s": max(0.0, cpu_seconds(self.apiserver_pid()) - server_cpu),
            "server MB": rss_kib(self.apiserver_pid()) / 1024,
            "failed writes": stats["failed_writes"] - stats0["failed_writes"],
            "unhealthy": stats["unhealthy"],
        }
        self.rows.append((title, row))
        print(f"{title}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in row.items()), flush=True)

    def run(self) -> None:
        args = self.args
        self.make_nodes()
        ok = {"policy": {"Active": "static", "ReservedResources": {"cpu": "1"}}}
        self.resource("default", ok)
        token = self.work / "agent.token"
        token.write_text(self.control.token(NS, "cri-resmgr-agent", 3600 * 6))
        socket = str(self.work / "config.sock")
        standin_p = self.spawn(sys.executable, str(HERE), "--standin", socket, log="standin.log")
        assert standin_p.stdout is not None and standin_p.stdout.readline().strip() == "ready"
        self.tally = self.spawn(sys.executable, "-m", "resmgr.agent", "tally", "--kubeconfig",
                   str(self.control.kubeconfig_for(NS, "cri-resmgr-tally")), "--config-namespace", NS,
                   "--interval", str(args.tally_interval), log="tally.log")
        shares = [self.nodes[i::args.workers] for i in range(args.workers)]
        common = [sys.executable, str(HERE), "--worker", "--server", self.control.server, "--ca",
                  str(self.control.pki.ca), "--token-file", str(token), "--socket", socket]
        n = len(self.nodes)

        # The start-up: every agent at once, as a DaemonSet rolled out to a fleet.
        self.audit.since()
        server_cpu, t0 = cpu_seconds(self.apiserver_pid()), time.time()
        self.workers = Workers([[*common, "--names", ",".join(s)] for s in shares], self.work)
        stats0 = {"received": 0, "failed_writes": 0}
        deadline = time.time() + 600
        seen = self.reported(t0, self.nodes, deadline, lambda r: True)
        tallied = self.wait_counts("default", (n, 0), t0, deadline)
        time.sleep(2)
        self.finish("start-up of the fleet", t0, self.nodes, seen, tallied, server_cpu, stats0)

        self.resource("group.g1", ok)
        self.scenario("a group's resource made", lambda: None, sorted(self.group), "group.g1",
                      counts=(len(self.group), 0))
        changed = {"policy": {"Active": "static", "ReservedResources": {"cpu": "2"}}}
        self.scenario("default changed", lambda: self.resource("default", changed),
                      [x for x in self.nodes if x not in self.group], "default", counts=(n - len(self.group), 0))
        g2 = {"policy": {"Active": "static", "ReservedResources": {"cpu": "1500m"}}}
        self.scenario("a group's resource changed", lambda: self.resource("group.g1", g2), sorted(self.group),
                      "group.g1", counts=(len(self.group), 0))
        bad = {"policy": {"Active": "static", "ReservedResources": {"cpu": "2"}, "static": {"NoSuchOption": True}}}
        self.scenario("a bad default rejected by every node", lambda: self.resource("default", bad),
                      [x for x in self.nodes if x not in self.group], "default", rejected=True,
                      counts=(0, n - len(self.group)))
        self.scenario("default fixed", lambda: self.resource("default", ok),
                      [x for x in self.nodes if x not in self.group], "default", counts=(n - len(self.group), 0))
        restarted = self.nodes[len(self.group)::20][:max(1, n // 20)]

        def restart() -> None:
            for i, share in enumerate(shares):
                mine = [x for x in restarted if x in share]
                if mine:
                    self.workers.send(i, "restart " + " ".join(mine))
        self.scenario("5% of the agents restarted", restart, restarted, "default")

        self.server_restart()
        self.scenario("default changed after the API server's restart", lambda: self.resource("default", changed),
                      [x for x in self.nodes if x not in self.group], "default", counts=(n - len(self.group), 0))
        self.rest(args.idle)

    def server_restart(self) -> None:
        """The API server stopped and started again: how long until every agent is healthy, and the
        requests that took."""
        self.audit.since()
        t0 = time.time()
        self.control.restart_apiserver()
        up = time.time() - t0
        deadline = time.time() + 300
        while time.time() < deadline and self.workers.gather()["unhealthy"]:
            time.sleep(0.5)
        healthy = time.time() - t0
        records = [r for r in self.audit.since() if r.get("user", {}).get("username") == AGENT_USER and once(r)]
        codes = collections.Counter((r.get("responseStatus") or {}).get("code", 0) for r in records)
        verbs = collections.Counter(r["verb"] for r in records)
        print(f"the API server restarted: ready again after {up:.1f} s, every agent healthy after {healthy:.1f} s; "
              f"{len(records) / len(self.nodes):.2f} requests per node ({dict(verbs)}), 429: {codes[429]}, "
              f"5xx: {sum(c for k, c in codes.items() if k >= 500)}", flush=True)

    def wait_counts(self, name: str, counts: tuple[int, int], t0: float, deadline: float) -> float:
        while time.time() < deadline:
            st = self.config_status(name)
            if st.get("observedGeneration") == st["generation"] and (st.get("success"), st.get("failure")) == counts:
                return time.time() - t0
            time.sleep(0.2)
        return float("nan")

    def rest(self, seconds: float) -> None:
        """The fleet at rest; then one real agent process's memory."""
        self.audit.since()
        server_cpu, stats0 = cpu_seconds(self.apiserver_pid()), self.workers.gather()
        time.sleep(seconds)
        stats = self.workers.gather()
        records = [r for r in self.audit.since() if r.get("user", {}).get("username") == AGENT_USER and once(r)]
        n = len(self.nodes)
        verbs = collections.Counter(r["verb"] for r in records)
        print(f"at rest for {seconds:.0f} s: {len(records) / n / (seconds / 60):.3f} requests per node per minute "
              f"({dict(verbs)}); agents' CPU {1000 * (stats['cpu'] - stats0['cpu']) / n / seconds:.3f} ms per node "
              f"per second; workers' RSS {stats['rss'] / 1024 / n:.2f} MB per node "
              f"({stats['rss'] / 1024:.0f} MB for {n}); API server CPU "
              f"{(cpu_seconds(self.apiserver_pid()) - server_cpu) / seconds * 100:.1f}% of a core, RSS "
              f"{rss_kib(self.apiserver_pid()) / 1024:.0f} MB; the tally's RSS "
              f"{rss_kib(self.tally.pid) / 1024:.0f} MB; "
              f"unhealthy agents {stats['unhealthy']}", flush=True)
        self.solo()

    def solo(self) -> None:
        """One agent as it runs on a node: its own process, at rest after applying."""
        socket = str(self.work / "config.sock")
        kubeconfig = str(self.control.kubeconfig_for(NS, "cri-resmgr-agent"))
        p = subprocess.Popen([sys.executable, "-m", "resmgr.agent", "--kubeconfig", kubeconfig, "--config-namespace",
                              NS, "--config-socket", socket, "--agent-socket", str(self.work / "solo.sock"),
                              "--log-level", "WARNING"], env={**os.environ, "NODE_NAME": "fleet-solo"},
                             stderr=open(self.work / "solo.log", "wb"))
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    obj = self.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.NODE_PLURAL,
                                                                   "fleet-solo")
                    if obj.get("status", {}).get("status") == rs.SUCCESS:
                        break
                except self.client.ApiException:
                    pass
                time.sleep(0.5)
            time.sleep(20)
            print(f"one agent process at rest (after applying default): RSS {rss_kib(p.pid) / 1024:.1f} MB",
                  flush=True)
        finally:
            p.terminate()
            p.wait(15)

    def close(self) -> None:
        if getattr(self, "workers", None) is not None:
            self.workers.stop()
        for p in self.procs:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.control.stop()


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    keys = ["nodes", "p50", "p99", "last", "tallied", "req/node", "writes/node", "409", "429", "tally writes",
            "tally bytes", "watch MB", "server cpu s", "failed writes"]
    out = ["| scenario | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for title, row in rows:
        cells = [f"{row[k]:.2f}" if isinstance(row[k], float) else str(row[k]) for k in keys]
        out.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000, help="simulated nodes (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=2, help="processes the agents run in (default: %(default)s)")
    ap.add_argument("--group-share", type=float, default=0.1, help="share of nodes in group g1 (default: 0.1)")
    ap.add_argument("--tally-interval", type=float, default=5.0, help="the tally's --interval (default: 5)")
    ap.add_argument("--idle", type=float, default=120, help="seconds of the fleet at rest (default: %(default)s)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--standin", metavar="SOCKET", help=argparse.SUPPRESS)
    for name in ("--server", "--ca", "--token-file", "--socket", "--names"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.standin:
        standin(args.standin)
        return 0
    if args.worker:
        worker(args)
        return 0
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per agent, and the server's
    bench = Bench(args)
    try:
        bench.run()
        print()
        print(table(bench.rows))
    finally:
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
