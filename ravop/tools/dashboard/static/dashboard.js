// The ravop dashboard: polls the server's JSON endpoints and draws tables and two SVG figures (the loss
// curve and the subgraph DAG) by hand, so the page needs nothing from the network but its own server.
"use strict";

const POLL_MS = 1000;
const SVG_NS = "http://www.w3.org/2000/svg";
const STATE_COLOURS = {waiting: "#cbd5e1", queued: "#93c5fd", running: "#f59e0b", done: "#10b981", failed: "#ef4444"};
const adminToken = new URLSearchParams(location.hash.slice(1)).get("admin");
let selected = null;       // id of the graph shown in the detail section
let userSelected = false;  // once the user clicks a graph, stop following the newest one

function $(id) { return document.getElementById(id); }

async function getJSON(path, options) {
  const response = await fetch(path, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function seconds(s) {
  if (s === null || s === undefined) return "";
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
}

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function svg(tag, attributes, parent) {
  const element = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attributes)) element.setAttribute(k, v);
  if (parent) parent.appendChild(element);
  return element;
}

function renderWorkers(workers) {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  $("worker-count").textContent = "(" + workers.length + ")";
  for (const w of workers) {
    const row = body.insertRow();
    row.className = "worker-row";
    cell(row, w.name);
    cell(row, w.device);
    cell(row, w.state, "state-" + w.state);
    cell(row, w.graph ? w.graph + " / subgraph " + w.subgraph + " for " + seconds(Date.now() / 1000 - w.since) : "");
    cell(row, w.threads);
    cell(row, bytes(w.rss) + " / " + bytes(w.memory_limit));
    cell(row, seconds(w.last_heartbeat_age) + " ago");
  }
}

// who runs each replica of the running fits, and what it has contributed (ravop/store/contributions.py)
function renderReplicas(rows) {
  $("replicas-section").hidden = !rows.length;
  const body = $("replicas").tBodies[0];
  body.replaceChildren();
  $("replicas-count").textContent = "(" + rows.length + ")";
  for (const r of rows) {
    const row = body.insertRow();
    cell(row, r.graph);
    cell(row, r.strategy.split("(")[0]);
    cell(row, r.replica.split(" ").pop());
    cell(row, r.workers.join(" \u2192 ") || "-");
    cell(row, r.steps_done);
    cell(row, r.samples_done);
    cell(row, r.rounds_without.length + " of " + r.rounds);
  }
}

function renderTrust(rows) {
  $("trust-section").hidden = !rows.length;
  const body = $("trust").tBodies[0];
  body.replaceChildren();
  $("trust-count").textContent = "(" + rows.length + ")";
  for (const r of rows) {
    const row = body.insertRow();
    cell(row, r.worker);
    cell(row, r.kind || "-");
    cell(row, r.confirmed);
    cell(row, r.streak);
    cell(row, r.unchecked);
    cell(row, r.mismatches);
    cell(row, r.banned ? "banned" : "", r.banned ? "state-failed" : "");
  }
}

function renderGraphs(graphs, admin) {
  const body = $("graphs").tBodies[0];
  body.replaceChildren();
  $("graph-count").textContent = "(" + graphs.length + ")";
  if (!userSelected && graphs.length) {
    const running = graphs.filter(g => g.state === "running");
    selected = (running.length ? running[running.length - 1] : graphs[graphs.length - 1]).id;
  }
  for (const g of graphs.slice().reverse()) {
    const row = body.insertRow();
    row.className = "graph-row" + (g.id === selected ? " selected" : "");
    row.dataset.id = g.id;
    row.onclick = () => { selected = g.id; userSelected = true; refresh(); };  // skipped if one is under way
    cell(row, g.name);
    cell(row, g.id);
    cell(row, g.state, "state-" + g.state);
    const progress = cell(row, "");
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = g.progress + "%";
    bar.appendChild(fill);
    progress.append(bar, " " + g.progress.toFixed(1) + "%");
    cell(row, g.eta === null ? "" : seconds(g.eta));
    cell(row, seconds(g.age));
    const actions = cell(row, "");
    if (admin && adminToken && (g.state === "running" || g.state === "activated")) {
      const button = document.createElement("button");
      button.textContent = "cancel";
      button.onclick = event => { event.stopPropagation(); cancel(g.id); };
      actions.appendChild(button);
    }
  }
}

async function cancel(id) {
  if (!confirm("Cancel graph " + id + "?")) return;
  await getJSON("/api/graphs/" + encodeURIComponent(id) + "/cancel",
                {method: "POST", headers: {Authorization: "Bearer " + adminToken}});
  refresh();
}

function renderLosses(losses) {
  // The server sends the computed steps thinned to the lowest and highest loss of each bucket (loss_points.py).
  const plot = $("loss-plot");
  plot.replaceChildren();
  const [width, height, right, top, bottom] = [520, 260, 12, 12, 28];
  const points = losses.batch, validation = losses.validation;
  plot.dataset.points = losses.computed;
  plot.dataset.drawn = points.length;
  $("loss-summary").textContent = losses.computed
    ? losses.computed + " of " + losses.steps + " steps, last " + losses.last.toPrecision(4)
    : (losses.steps ? "no step computed yet" : "this graph persists no losses");
  if (!points.length) return;
  const values = points.concat(validation).map(p => p[1]);
  let [low, high] = [Math.min(...values), Math.max(...values)];
  if (high === low) { high += 1; low -= 1; }
  const labels = [low, (low + high) / 2, high].map(v => [v, v.toPrecision(3)]);
  // The axis sits right of its widest label (11 px digits are at most ~7 px wide), so no label is cut off.
  const left = 14 + 7 * Math.max(...labels.map(([, text]) => text.length));
  const steps = Math.max(losses.steps - 1, 1);
  const x = i => left + (width - left - right) * i / steps;
  const y = v => top + (height - top - bottom) * (high - v) / (high - low);
  svg("line", {x1: left, y1: top, x2: left, y2: height - bottom, stroke: "#9ca3af"}, plot);
  svg("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, stroke: "#9ca3af"}, plot);
  for (const [v, text] of labels) {
    svg("text", {class: "axis-label", x: left - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11,
                 fill: "#4b5563"}, plot).textContent = text;
  }
  svg("text", {x: width - right, y: height - 8, "text-anchor": "end", "font-size": 11, fill: "#4b5563"}, plot)
    .textContent = "step " + losses.steps;
  svg("polyline", {id: "loss-curve", points: points.map(p => x(p[0]) + "," + y(p[1])).join(" "),
                   fill: "none", stroke: "#2563eb", "stroke-width": 1.5}, plot);
  for (const [i, v] of validation) {
    svg("circle", {class: "validation-point", cx: x(i), cy: y(v), r: 3, fill: "#f59e0b"}, plot);
  }
}

function renderDag(dag) {
  const plot = $("dag");
  plot.replaceChildren();
  const levels = new Map();
  for (const s of dag.subgraphs) {
    if (!levels.has(s.level)) levels.set(s.level, []);
    levels.get(s.level).push(s);
  }
  const columns = Math.max(levels.size, 1);
  const rows = Math.max(1, ...[...levels.values()].map(l => l.length));
  const width = 520, height = Math.max(260, Math.min(2000, rows * 14 + 20));
  plot.setAttribute("viewBox", "0 0 " + width + " " + height);
  const radius = Math.max(2, Math.min(12, (width / columns) / 3, (height / rows) / 3));
  const place = new Map();
  for (const [level, members] of levels) {
    members.forEach((s, i) => place.set(s.id, [
      20 + (width - 40) * (columns === 1 ? 0.5 : level / (columns - 1)),
      20 + (height - 40) * (members.length === 1 ? 0.5 : i / (members.length - 1))]));
  }
  for (const [a, b] of dag.edges) {
    const [p, q] = [place.get(a), place.get(b)];
    svg("line", {x1: p[0], y1: p[1], x2: q[0], y2: q[1], stroke: "#d1d5db", "stroke-width": 1}, plot);
  }
  const counts = {};
  for (const s of dag.subgraphs) {
    counts[s.state] = (counts[s.state] || 0) + 1;
    const [cx, cy] = place.get(s.id);
    const node = svg("circle", {class: "subgraph subgraph-" + s.state, cx, cy, r: radius,
                                fill: STATE_COLOURS[s.state], stroke: "#374151", "stroke-width": 0.5}, plot);
    svg("title", {}, node).textContent = "subgraph " + s.id + ": " + s.state + ", " + s.ops + " ops on " +
      s.device + (s.worker ? ", worker " + s.worker : "");
  }
  $("dag-summary").textContent = dag.subgraphs.length + " subgraphs, " + dag.edges.length + " edges";
  $("dag-legend").replaceChildren(...Object.keys(STATE_COLOURS).map(state => {
    const item = document.createElement("span");
    item.innerHTML = '<i style="background:' + STATE_COLOURS[state] + '"></i>';
    item.append(state + " " + (counts[state] || 0));
    return item;
  }));
}

function renderFailures(failures) {
  $("failures").replaceChildren(...failures.map(f => {
    const item = document.createElement("li");
    item.textContent = (f.op ? "op " + f.op : "subgraph " + f.subgraph) + (f.source ? " at " + f.source : "") +
      (f.worker ? " on " + f.worker : "") + ": " + f.error;
    return item;
  }));
}

let refreshing = false;  // a slow reply must not pile up requests behind it

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    const status = await getJSON("/api/status");
    $("token").textContent = "token " + status.token;
    renderWorkers(status.workers);
    renderReplicas(status.replicas || []);
    renderTrust(status.trust || []);
    renderGraphs(status.graphs, status.admin);
    if (selected !== null) {
      const graph = status.graphs.find(g => g.id === selected);
      const base = "/api/graphs/" + encodeURIComponent(selected);
      const failed = graph && (graph.state === "failed" || graph.state === "cancelled");  // only those have failures
      const [dag, losses, failures] = await Promise.all([getJSON(base + "/dag"), getJSON(base + "/losses"),
        failed ? getJSON(base + "/failures") : {failures: []}]);
      $("detail").hidden = false;
      $("detail-name").textContent = (graph ? graph.name + " " : "") + "(" + selected + ")";
      renderDag(dag);
      renderLosses(losses);
      renderFailures(failures.failures);
    }
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("error").textContent = "";
  } catch (error) {
    $("error").textContent = String(error.message || error);
  } finally {
    refreshing = false;
  }
}

refresh();
setInterval(refresh, POLL_MS);
