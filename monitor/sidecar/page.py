"""The sidecar's dashboard: one self-contained HTML page (inline CSS, JS and SVG; nothing fetched from
elsewhere). The server inlines the current `/api/samples` document, so the page draws with data on load,
then re-polls `/api/samples` every interval. Each chart is an `<svg data-chart=ID data-points=N>`; the
numbers are in elements with ids (`agg-*`), so a headless browser's DOM shows what the page displays."""

from __future__ import annotations

import json
from typing import Any

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>NInfer monitor</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font:13px system-ui,sans-serif;margin:12px;background:#111418;color:#d8dee9}
h1{font-size:16px;margin:0 0 8px} .muted{color:#8a93a3}
#status span{margin-right:14px} .up{color:#7fd18b} .down{color:#ef6b73}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:10px;margin-top:10px}
.card{background:#1a1f26;border:1px solid #2a313b;border-radius:6px;padding:8px}
.card h2{font-size:13px;margin:0 0 4px} .legend span{margin-right:10px}
svg{width:100%;height:150px;display:block} table{border-collapse:collapse;width:100%}
td,th{padding:2px 6px;border-bottom:1px solid #2a313b;text-align:right} th{color:#8a93a3;font-weight:normal}
td:first-child,th:first-child{text-align:left}
</style></head>
<body>
<h1>NInfer monitor <span class="muted" id="model"></span></h1>
<div id="status"><span id="server-state"></span><span id="updated" class="muted"></span></div>
<table id="aggregates"><tr><th>window</th><th>requests</th><th>rejected</th><th>errors</th><th>TTFT p50</th>
<th>TTFT p95</th><th>queue p95</th><th>prefix hit</th><th>MTP accept</th><th>decode tok/s</th></tr>
<tr><td id="agg-window"></td><td id="agg-requests"></td><td id="agg-rejected"></td><td id="agg-errors"></td>
<td id="agg-ttft-p50"></td><td id="agg-ttft-p95"></td><td id="agg-queue-p95"></td><td id="agg-prefix-hit"></td>
<td id="agg-mtp-accept"></td><td id="agg-decode-tps"></td></tr></table>
<div class="grid" id="charts"></div>
<h2 style="font-size:13px;margin-top:12px">Recent requests</h2>
<table id="events"><thead><tr><th>id</th><th>api</th><th>finish</th><th>prompt</th><th>out</th><th>TTFT s</th>
<th>queue s</th><th>prefix</th><th>path</th><th>decode tok/s</th></tr></thead><tbody></tbody></table>
<script id="initial" type="application/json">__INITIAL__</script>
<script>
"use strict";
const INTERVAL_MS = __INTERVAL_MS__;
const COLORS = ["#5fb3f9", "#f6c177", "#7fd18b", "#ef6b73", "#c39ff5"];
const r = (s) => s.rolling || {};
const gpu0 = (s) => (s.gpu && s.gpu.length ? s.gpu[0] : {});
const MIB = 1024 * 1024;
const CHARTS = [
  {id: "throughput", title: "Throughput (tokens/s)", series: [
    ["decode", (s) => s.decode_tps], ["prefill", (s) => s.prefill_tps]]},
  {id: "ttft", title: "Time to first token (s)", series: [
    ["p50", (s) => r(s).ttft_p50], ["p95", (s) => r(s).ttft_p95]], events: ["request", (e) => e.ttft]},
  {id: "queue", title: "Scheduler queue", series: [
    ["waiting", (s) => s.waiting], ["running", (s) => s.running], ["queue p95 s", (s) => r(s).queue_p95]]},
  {id: "prefix", title: "Prefix-hit rate (prompt tokens reused)", series: [
    ["hit rate", (s) => r(s).prefix_hit_rate]], paths: true},
  {id: "kv", title: "Device KV pages in use (fraction)", series: [["usage", (s) => s.kv_usage]]},
  {id: "host_cache", title: "Host KV cache (MiB)", series: [
    ["used", (s) => s.host_kv_used_bytes == null ? null : s.host_kv_used_bytes / MIB],
    ["capacity", (s) => s.host_kv_capacity_bytes == null ? null : s.host_kv_capacity_bytes / MIB]]},
  {id: "mtp", title: "MTP acceptance (accepted / drafted)", series: [
    ["accept", (s) => r(s).mtp_accept_rate]]},
  {id: "gpu", title: "GPU", series: [
    ["util %", (s) => gpu0(s).util_pct], ["mem %", (s) => gpu0(s).mem_total_mb ?
      100 * gpu0(s).mem_used_mb / gpu0(s).mem_total_mb : null], ["power W", (s) => gpu0(s).power_w]]},
];
const fmt = (v, d = 3) => (v == null || !isFinite(v) ? "–" : (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(d)));
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function drawChart(spec, doc) {
  let card = document.getElementById("card-" + spec.id);
  if (!card) {
    card = document.createElement("div"); card.className = "card"; card.id = "card-" + spec.id;
    card.innerHTML = "<h2>" + spec.title + "</h2><div class='legend'></div>";
    card.appendChild(el("svg", {viewBox: "0 0 400 150", preserveAspectRatio: "none", "data-chart": spec.id}));
    document.getElementById("charts").appendChild(card);
  }
  const svg = card.querySelector("svg"); svg.replaceChildren();
  const lines = spec.series.map(([name, f]) => [name, doc.samples.map((s) => [s.t, f(s)])]);
  if (spec.events) lines.push([spec.events[0], doc.events.map((e) => [e.t, spec.events[1](e)])]);
  const pts = lines.map(([n, p]) => [n, p.filter(([t, v]) => t != null && v != null && isFinite(v))]);
  const all = pts.flatMap(([, p]) => p);
  svg.setAttribute("data-points", String(all.length));
  const legend = card.querySelector(".legend"); legend.replaceChildren();
  pts.forEach(([name, p], i) => {
    const span = document.createElement("span"); span.style.color = COLORS[i % COLORS.length];
    span.dataset.series = name; span.dataset.points = String(p.length);
    span.textContent = name + ": " + (p.length ? fmt(p[p.length - 1][1]) : "no data");
    legend.appendChild(span);
  });
  if (spec.paths) {
    const paths = (doc.aggregates || {}).reuse_paths || {};
    const span = document.createElement("span"); span.className = "muted"; span.id = "reuse-paths";
    span.textContent = "reuse paths: " + Object.entries(paths).map(([k, v]) => k + "=" + v).join(" ");
    legend.appendChild(span);
  }
  if (!all.length) { el("text", {x: 200, y: 80, fill: "#8a93a3", "text-anchor": "middle"}, svg).textContent = "no data"; return; }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const vmax = Math.max(...all.map((p) => p[1]), 1e-9);
  const x = (t) => (t1 > t0 ? 5 + 390 * (t - t0) / (t1 - t0) : 200), y = (v) => 145 - 135 * v / vmax;
  el("text", {x: 4, y: 12, fill: "#8a93a3", "font-size": 10}, svg).textContent = fmt(vmax);
  pts.forEach(([, p], i) => {
    const color = COLORS[i % COLORS.length];
    if (p.length > 1) el("polyline", {fill: "none", stroke: color, "stroke-width": 1.5,
      points: p.map(([t, v]) => x(t).toFixed(1) + "," + y(v).toFixed(1)).join(" ")}, svg);
    p.slice(-60).forEach(([t, v]) => el("circle", {cx: x(t), cy: y(v), r: 2, fill: color}, svg));
  });
}
function render(doc) {
  const a = doc.aggregates || {}, req = a.requests || {}, latest = doc.latest || {};
  const set = (id, v) => { document.getElementById(id).textContent = v; };
  set("model", doc.server.model || "");
  const st = document.getElementById("server-state");
  st.textContent = doc.server.up ? "server up" : "server down"; st.className = doc.server.up ? "up" : "down";
  set("updated", "updated " + new Date(doc.generated_unix_ms).toLocaleTimeString());
  set("agg-window", (a.window_seconds / 60).toFixed(0) + " min"); set("agg-requests", String(req.done ?? 0));
  set("agg-rejected", String(req.rejected ?? 0)); set("agg-errors", String(req.errors ?? 0));
  set("agg-ttft-p50", fmt(a.ttft_p50)); set("agg-ttft-p95", fmt(a.ttft_p95)); set("agg-queue-p95", fmt(a.queue_p95));
  set("agg-prefix-hit", fmt(a.prefix_hit_rate)); set("agg-mtp-accept", fmt(a.mtp_accept_rate));
  set("agg-decode-tps", fmt(latest.decode_tps));
  CHARTS.forEach((c) => drawChart(c, doc));
  const body = document.querySelector("#events tbody"); body.replaceChildren();
  doc.events.slice(-20).reverse().forEach((e) => {
    const tr = document.createElement("tr");
    [e.id, e.api, e.finish_reason, e.prompt_tokens, e.completion_tokens, fmt(e.ttft), fmt(e.queue),
     e.prefix_hit_tokens, e.prefix_path, fmt(e.decode_tps)].forEach((v) => {
      const td = document.createElement("td"); td.textContent = v == null ? "–" : String(v); tr.appendChild(td); });
    body.appendChild(tr);
  });
  document.body.dataset.rendered = String(doc.generated_unix_ms);
}
render(JSON.parse(document.getElementById("initial").textContent));
setInterval(() => fetch("api/samples?limit=720").then((x) => x.json()).then(render).catch(() => {
  const st = document.getElementById("server-state"); st.textContent = "monitor unreachable"; st.className = "down"; }),
  INTERVAL_MS);
</script>
</body></html>
"""


def render_page(snapshot: dict[str, Any], interval_seconds: float) -> bytes:
    initial = json.dumps(snapshot, allow_nan=False, default=str).replace("</", "<\\/")
    html = PAGE.replace("__INITIAL__", initial).replace(
        "__INTERVAL_MS__", str(max(int(interval_seconds * 1000), 500))
    )
    return html.encode("utf-8")
