// Draws the state document of /api/v1/state (or one embedded as window.CRI_RESMGR_STATE)
// as sockets > dies > NUMA nodes > cores > CPUs, coloured by who holds each CPU.
"use strict";

const REFRESH_MS = 2000;
let state = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function gib(bytes) {
  return bytes >= 1 << 30 ? (bytes / (1 << 30)).toFixed(1) + " GiB" : Math.round(bytes / (1 << 20)) + " MiB";
}

function shortName(who) {
  const parts = who.split("/");
  return parts[parts.length - 1];
}

function drawMachine(doc) {
  const byId = new Map(doc.cpus.map(c => [c.id, c]));
  const nodes = new Map(doc.topology.nodes.map(n => [n.id, n]));
  const machine = el("div", {class: "machine"});
  for (const socket of doc.topology.sockets) {
    const s = el("div", {class: "socket", "data-socket": socket.id}, el("div", {class: "label"}, `socket ${socket.id}`));
    for (const die of socket.dies) {
      const d = el("div", {class: "die", "data-die": die.id}, el("div", {class: "label"}, `die ${die.id}`));
      for (const node of die.nodes) {
        const info = nodes.get(node.id);
        const what = info ? `NUMA node ${node.id} · ${info.kind} ${gib(info.memory)}` : "no NUMA node";
        const n = el("div", {class: "node", "data-node": node.id}, el("div", {class: "label"}, what));
        const cores = el("div", {class: "cores"});
        for (const core of node.cores) {
          const c = el("div", {class: "core", title: `core ${core.id}`});
          for (const id of core.cpus) {
            const cpu = byId.get(id) || {role: "free", holders: []};
            const holders = cpu.holders || [];
            const text = holders.length === 1 ? shortName(holders[0])
              : holders.length ? `${holders.length} containers` : cpu.role;
            c.append(el("div", {class: `cpu role-${cpu.role}`, "data-cpu": id, "data-role": cpu.role,
                                "data-holders": holders.join(" "),
                                title: `CPU ${id}: ${cpu.role}${holders.length ? "\n" + holders.join("\n") : ""}`},
                        el("b", {}, `cpu ${id}`), text));
          }
          cores.append(c);
        }
        n.append(cores);
        d.append(n);
      }
      s.append(d);
    }
    machine.append(s);
  }
  const memOnly = doc.topology.memory_nodes || [];
  if (memOnly.length) {
    const m = el("div", {class: "socket"}, el("div", {class: "label"}, "memory-only NUMA nodes"));
    for (const id of memOnly) {
      const info = nodes.get(id);
      m.append(el("div", {class: "node", "data-node": id},
                  el("div", {class: "label"}, `node ${id} · ${info.kind} ${gib(info.memory)}`)));
    }
    machine.append(m);
  }
  document.getElementById("machine").replaceWith(Object.assign(machine, {id: "machine"}));
}

function table(id, head, rows) {
  const t = el("table", {id});
  t.append(el("tr", {}, ...head.map(h => el("th", {}, h))));
  for (const [attrs, cells] of rows) t.append(el("tr", attrs, ...cells.map(c => el("td", {}, c === "" ? "-" : c))));
  document.getElementById(id).replaceWith(t);
}

function drawTables(doc) {
  table("pools", ["pool", "parent", "CPUs", "shared now", "reserved", "isolated free", "exclusive grants",
                  "containers", "shared m requested", "shared m free", "memory nodes"],
        doc.pools.map(p => [{"data-pool": p.name}, [p.name, p.parent || "", p.cpus, p.shared || "", p.reserved || "",
          p.isolated || "", p.stats.exclusive_grants, p.stats.containers, p.stats.shared_milli_requested,
          p.stats.shared_milli_free, p.mems || ""]]));
  const rows = [];
  for (const pod of doc.pods) {
    for (const c of pod.containers) {
      const who = `${pod.namespace}/${pod.name}/${c.name}`;
      const grant = c.fallback ? `${c.kind} (on ${c.fallback} CPUs)` : c.kind;
      rows.push([{"data-container": who}, [who, pod.qos_class, c.state, grant || "", c.pool || "",
        c.exclusive || "", c.cpus || "", c.mems || "", c.rdt_class || "", c.blockio_class || ""]]);
    }
  }
  table("containers", ["container", "QoS", "state", "grant", "pool", "exclusive", "CPUs", "mems", "RDT", "block I/O"],
        rows);
}

function highlight() {
  const q = document.getElementById("find").value.trim().toLowerCase();
  for (const cpu of document.querySelectorAll(".cpu")) {
    const hit = q && cpu.dataset.holders.toLowerCase().split(" ").some(h => h.includes(q));
    cpu.classList.toggle("found", !!hit);
    cpu.classList.toggle("dim", !!q && !hit);
  }
  for (const row of document.querySelectorAll("tr[data-container]")) {
    row.classList.toggle("found", !!q && row.dataset.container.toLowerCase().includes(q));
  }
}

function draw(doc) {
  state = doc;
  document.getElementById("policy").textContent = doc.policy;
  document.getElementById("source").textContent = (doc.config && doc.config.source) || "-";
  const containers = doc.pods.reduce((n, p) => n + p.containers.length, 0);
  document.getElementById("counts").textContent =
    `${doc.cpus.length} CPUs, ${doc.pods.length} pods, ${containers} containers`;
  document.getElementById("updated").textContent = new Date(doc.time * 1000).toLocaleTimeString();
  document.getElementById("notices").replaceChildren(...(doc.notices || []).map(n => el("div", {class: "notice"}, n)));
  drawMachine(doc);
  drawTables(doc);
  highlight();
  document.body.dataset.drawn = String(Number(document.body.dataset.drawn || 0) + 1);
}

async function refresh() {
  try {
    const resp = await fetch("api/v1/state", {cache: "no-store"});
    if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
    draw(await resp.json());
    document.getElementById("error").textContent = "";
  } catch (err) {
    document.getElementById("error").textContent = `(cannot refresh: ${err.message})`;
  }
}

document.getElementById("find").addEventListener("input", highlight);
if (window.CRI_RESMGR_STATE) {
  draw(window.CRI_RESMGR_STATE);
} else {
  refresh();
  setInterval(refresh, REFRESH_MS);
}
