// The service map page that --ui_address serves (ui.h): plain HTML, CSS and JavaScript, no
// libraries. It polls flows.json every 2 s and draws:
//   - a graph: sources on the left, Services in the middle, destinations on the right; a node
//     per pod ("namespace/name", coloured by namespace), Service or bare address; an edge per
//     (from, to) pair, green when every flow on it was forwarded, red when every flow was
//     dropped, orange for both; hovering an edge names its counts and drop reasons;
//   - a table of the newest flows underneath.
// Elements carry data- attributes (data-src, data-dst, data-verdict, data-reasons) so that a
// test in a real browser (tests/e2e/observe_test.sh) can read what is drawn.
#include "agent/monitor/ui.h"
#include "nlohmann/json.hpp"

namespace sluice::monitor {

const char kFlowUiPage[] = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Sluice service map</title>
<style>
  body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 4px; }
  #status { color: #666; margin-bottom: 8px; }
  svg { border: 1px solid #ddd; background: #fafafa; }
  .node text { font-size: 12px; }
  .edge { stroke-width: 2.5; fill: none; }
  .edge[data-verdict="forwarded"] { stroke: #2a9d3a; }
  .edge[data-verdict="dropped"] { stroke: #d62828; stroke-dasharray: 6 3; }
  .edge[data-verdict="mixed"] { stroke: #f08c00; }
  table { border-collapse: collapse; margin-top: 12px; width: 100%; }
  th, td { border-bottom: 1px solid #eee; padding: 2px 8px; text-align: left; white-space: nowrap; }
  tr[data-verdict="dropped"] td { color: #b00020; }
  .legend span { margin-right: 14px; }
</style>
</head>
<body>
<h1>Sluice service map</h1>
<div id="status">loading…</div>
<div class="legend"><span style="color:#2a9d3a">━ forwarded</span><span style="color:#d62828">╍ dropped</span><span style="color:#f08c00">━ both</span></div>
<svg id="map" width="960" height="200" xmlns="http://www.w3.org/2000/svg"></svg>
<table>
  <thead><tr><th>time</th><th>type</th><th>source</th><th>destination</th><th>service</th><th>verdict</th><th>reason</th></tr></thead>
  <tbody id="flows"></tbody>
</table>
<script>
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const palette = ["#1971c2", "#9c36b5", "#e8590c", "#2f9e44", "#c2255c", "#0c8599", "#5f3dc4"];
const nsColour = {};
function colourOf(ns) {
  if (!ns) return "#868e96";
  if (!(ns in nsColour)) nsColour[ns] = palette[Object.keys(nsColour).length % palette.length];
  return nsColour[ns];
}
function peer(p) {
  if (!p) return null;
  if (p.pod) return { id: (p.namespace || "default") + "/" + p.pod, ns: p.namespace || "default", kind: "pod" };
  if (p.ip) return { id: p.ip, ns: "", kind: "address" };
  return null;
}
function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
// Flows -> nodes and edges. A translation is client -> Service -> backend; a policy verdict or
// a drop is source -> destination.
function graphOf(flows) {
  const nodes = new Map(), edges = new Map();
  const node = (n) => { if (n && !nodes.has(n.id)) nodes.set(n.id, { ...n, from: 0, to: 0 }); return n; };
  const edge = (a, b, verdict, reason) => {
    if (!a || !b || a.id === b.id) return;
    node(a); node(b);
    const key = a.id + "|" + b.id;
    if (!edges.has(key)) edges.set(key, { src: a.id, dst: b.id, forwarded: 0, dropped: 0, reasons: new Set() });
    const e = edges.get(key);
    if (verdict === "dropped") { e.dropped++; if (reason) e.reasons.add(reason); } else { e.forwarded++; }
    nodes.get(a.id).from++; nodes.get(b.id).to++;
  };
  for (const f of flows) {
    const src = peer(f.source);
    if (f.type === "translate" && f.service) {
      const svc = { id: "svc:" + (f.service.namespace ? f.service.namespace + "/" + f.service.name : "rev-nat-" + f.service.rev_nat_id),
                    ns: f.service.namespace || "", kind: "service" };
      edge(src, svc, f.verdict, f.drop_reason);
      edge(svc, peer(f.backend), f.verdict, f.drop_reason);
    } else if (f.type === "policy" || f.type === "drop") {
      edge(src, peer(f.destination), f.verdict, f.drop_reason);
    }
  }
  return { nodes, edges };
}
function draw(g) {
  const svg = document.getElementById("map");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const cols = [[], [], []];
  for (const n of g.nodes.values()) {
    n.col = n.kind === "service" ? 1 : (n.to === 0 ? 0 : 2);
    cols[n.col].push(n);
  }
  const rowH = 44, width = 960;
  const rows = Math.max(1, ...cols.map((c) => c.length));
  const top = 70;  // room for the arcs of edges that pass the Services' column
  svg.setAttribute("height", String(top + 20 + rows * rowH));
  cols.forEach((c, i) => {
    c.sort((a, b) => (a.ns + a.id).localeCompare(b.ns + b.id));
    c.forEach((n, j) => { n.x = 120 + i * (width - 240) / 2; n.y = top + j * rowH; });
  });
  for (const e of g.edges.values()) {
    const a = g.nodes.get(e.src), b = g.nodes.get(e.dst);
    const verdict = e.dropped && e.forwarded ? "mixed" : (e.dropped ? "dropped" : "forwarded");
    const reasons = [...e.reasons].sort().join(",");
    const line = el("path", { class: "edge", "data-src": e.src, "data-dst": e.dst, "data-verdict": verdict,
                              "data-reasons": reasons, "data-forwarded": e.forwarded, "data-dropped": e.dropped,
                              d: Math.abs(a.col - b.col) === 2
                                   // pod to pod, past the Services: an arc above them
                                   ? `M${a.x},${a.y} C${a.x + 80},${a.y - 60} ${b.x - 80},${b.y - 60} ${b.x},${b.y}`
                                   : `M${a.x},${a.y} C${(a.x + b.x) / 2},${a.y} ${(a.x + b.x) / 2},${b.y} ${b.x},${b.y}` });
    line.appendChild(el("title", {}, `${e.src} → ${e.dst}: ${e.forwarded} forwarded, ${e.dropped} dropped` +
                                     (reasons ? ` (${reasons})` : "")));
    svg.appendChild(line);
  }
  for (const n of g.nodes.values()) {
    const grp = el("g", { class: "node", "data-id": n.id, "data-kind": n.kind, "data-namespace": n.ns });
    const c = colourOf(n.ns);
    if (n.kind === "service") grp.appendChild(el("rect", { x: n.x - 9, y: n.y - 9, width: 18, height: 18, fill: c }));
    else grp.appendChild(el("circle", { cx: n.x, cy: n.y, r: 9, fill: n.kind === "pod" ? c : "#fff", stroke: c, "stroke-width": 2 }));
    grp.appendChild(el("text", { x: n.x, y: n.y + 24, "text-anchor": "middle" }, n.id.replace(/^svc:/, "")));
    svg.appendChild(grp);
  }
}
function text(p) { const n = peer(p); return n ? n.id + (p.port ? ":" + p.port : "") : ""; }
function table(flows) {
  const body = document.getElementById("flows");
  while (body.firstChild) body.removeChild(body.firstChild);
  for (const f of flows.slice(-200).reverse()) {
    const tr = document.createElement("tr");
    tr.className = "flow";
    tr.dataset.verdict = f.verdict || "";
    tr.dataset.reason = f.drop_reason || "";
    const svc = f.service && f.service.name ? f.service.namespace + "/" + f.service.name : "";
    for (const v of [(f.time || "").replace("T", " ").replace(/\.\d+/, ""), f.type, text(f.source),
                     text(f.destination), svc, f.verdict, f.drop_reason || ""]) {
      const td = document.createElement("td");
      td.textContent = v || "";
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
async function poll() {
  try {
    const r = await fetch("flows.json", { cache: "no-store" });
    const d = await r.json();
    draw(graphOf(d.flows));
    table(d.flows);
    document.getElementById("status").textContent =
      `node ${d.node}: ${d.flows.length} flows; the datapath reports flows while this page is open`;
    document.body.dataset.loaded = "true";
  } catch (err) {
    document.getElementById("status").textContent = "cannot read flows.json: " + err;
  }
  setTimeout(poll, 2000);
}
poll();
</script>
</body>
</html>
)html";

}  // namespace sluice::monitor
