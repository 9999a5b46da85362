// kvgate dashboard: polls /dashboard/state.json and draws it. No framework, no build step.
"use strict";

const TOKEN_KEY = "kvgate.adminToken";
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(250, Number(params.get("refresh") || 2000));
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const reasonColors = new Map();

function colorOf(reason) {
  if (!reasonColors.has(reason)) reasonColors.set(reason, COLORS[reasonColors.size % COLORS.length]);
  return reasonColors.get(reason);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.setAttribute("style", v);
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

const pct = (x) => (x === null || x === undefined ? "—" : `${(100 * x).toFixed(1)}%`);
const num = (x, digits = 0) => (x === null || x === undefined ? "—" : Number(x).toFixed(digits));
const secs = (x) => (x === null || x === undefined ? "—" : x < 1 ? `${Math.round(1000 * x)} ms` : `${x.toFixed(1)} s`);
const shortUrl = (url) => String(url).replace(/^https?:\/\//, "");

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function bar(fraction, label, cls) {
  const width = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return el("div", { class: `bar ${cls || ""}` },
    el("div", { class: "fill", style: `width:${width.toFixed(1)}%` }), el("span", {}, label));
}

function kvClass(kv, t) {
  if (kv === null || kv === undefined) return "";
  if (kv >= t.kv_hard) return "bad";
  if (kv >= t.kv_soft) return "warn";
  return "";
}

function drawFleet(state) {
  const t = state.thresholds;
  fill(document.querySelector("#fleet tbody"), state.workers.map((w) => {
    const load = w.max_in_flight ? w.in_flight / w.max_in_flight : 0;
    const mem = w.gpu_mem_used_mib !== null && w.gpu_mem_total_mib
      ? `${(w.gpu_mem_used_mib / 1024).toFixed(1)} / ${(w.gpu_mem_total_mib / 1024).toFixed(1)} GiB` : "—";
    const temp = w.gpu_temp_c === null ? "—" : w.gpu_temp_c.toFixed(0);
    const tempCls = w.gpu_temp_c !== null && w.gpu_temp_c >= t.temp_soft_c ? "warn" : "";
    // Readings older than health.stale_after: routing treats them as unknown; so do we.
    const stale = w.signals_fresh ? "" : "stale";
    return el("tr", { "data-worker": w.id, class: w.hot.length ? "hot" : "" },
      el("td", { class: "worker" }, shortUrl(w.id)),
      el("td", {}, `${w.model} ${w.version}`),
      el("td", { class: "health" }, el("span", { class: `badge ${w.health}` }, w.health)),
      el("td", { class: "in-flight" }, bar(load, `${w.in_flight} / ${w.max_in_flight}`)),
      el("td", { class: `running ${stale}` }, num(w.running)),
      el("td", { class: `waiting ${stale}` }, num(w.waiting)),
      el("td", { class: `kv ${stale}`, title: w.kv_capacity_tokens ? `of ${w.kv_capacity_tokens} tokens; ` +
        `${w.kv_in_flight_tokens} more expected from requests in flight` : "" },
        bar(w.kv_usage, pct(w.kv_usage), kvClass(w.kv_usage, t))),
      el("td", { class: "pressure" }, el("span", { class: `badge p-${w.pressure}` }, w.pressure)),
      el("td", { class: `temp ${tempCls} ${stale}` }, temp),
      el("td", { class: `mem ${stale}` }, mem),
      el("td", { class: "affinities" }, num(w.affinities)),
      el("td", { class: `age ${w.signals_fresh ? "" : "warn"}` }, secs(w.scrape_age_s)),
      // Learned from observed TTFTs (core.speed): tokens/s of prefill, the fixed overhead.
      el("td", { class: "speed", title: w.overhead_s === null ? "" : `overhead ${secs(w.overhead_s)}` },
        w.prefill_tokens_per_s === null ? "—" : `${Math.round(w.prefill_tokens_per_s)} tok/s`),
      el("td", { class: "ttft-error" }, w.ttft_error === null ? "—" : pct(w.ttft_error)),
      el("td", { class: "why" }, w.hot.join("; ") || "—"));
  }));
}

function drawBars(state) {
  const chart = document.getElementById("traffic-chart");
  const buckets = state.traffic.buckets;
  const W = Number(chart.getAttribute("width")), H = Number(chart.getAttribute("height"));
  const left = 40, bottom = 22, top = 8, right = 8;
  const plotW = W - left - right, plotH = H - top - bottom;
  const max = Math.max(1, ...buckets.map((b) => b.requests));
  const nodes = [];
  const reasons = new Set();
  buckets.forEach((b) => Object.keys(b.reasons).forEach((r) => reasons.add(r)));
  const step = plotW / buckets.length;
  buckets.forEach((b, i) => {
    let y = top + plotH;
    const parts = Object.entries(b.reasons).sort();
    const refused = b.requests - parts.reduce((s, [, n]) => s + n, 0);
    // Answered by the gateway itself (shed, bad request, unknown model): no route reason.
    if (refused > 0) {
      parts.push(["(refused)", refused]);
      reasons.add("(refused)");
    }
    for (const [reason, n] of parts) {
      const h = (n / max) * plotH;
      y -= h;
      const rect = svg("rect", { x: left + i * step + 1, y, width: Math.max(1, step - 2), height: h,
        fill: reason === "(refused)" ? "#999" : colorOf(reason) });
      const tip = svg("title", {});
      tip.textContent = `${reason}: ${n}`;
      rect.append(tip);
      nodes.push(rect);
    }
  });
  // y axis: 0, max/2, max
  for (const v of [0, Math.round(max / 2), max]) {
    const y = top + plotH - (v / max) * plotH;
    nodes.push(svg("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid" }));
    const label = svg("text", { x: left - 4, y: y + 4, "text-anchor": "end", class: "axis" });
    label.textContent = String(v);
    nodes.push(label);
  }
  const span = buckets.length * state.traffic.bucket_s;
  for (const [frac, text] of [[0, `-${Math.round(span / 60)} min`], [1, "now"]]) {
    const label = svg("text", { x: left + frac * plotW, y: H - 6,
      "text-anchor": frac ? "end" : "start", class: "axis" });
    label.textContent = text;
    nodes.push(label);
  }
  chart.replaceChildren(...nodes);
  document.getElementById("traffic-span").textContent =
    `last ${Math.round(span / 60)} minutes in ${state.traffic.bucket_s}-second buckets`;
  const legend = document.getElementById("traffic-legend");
  legend.replaceChildren(...[...reasons].sort().map((r) =>
    el("span", { class: "key" }, el("i", { style: `background:${r === "(refused)" ? "#999" : colorOf(r)}` }), r)));
}

function drawHits(state) {
  const chart = document.getElementById("hit-chart");
  const buckets = state.traffic.buckets;
  const W = Number(chart.getAttribute("width")), H = Number(chart.getAttribute("height"));
  const left = 40, bottom = 22, top = 8, right = 8;
  const plotW = W - left - right, plotH = H - top - bottom;
  const step = plotW / buckets.length;
  const nodes = [];
  for (const v of [0, 0.5, 1]) {
    const y = top + plotH - v * plotH;
    nodes.push(svg("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid" }));
    const label = svg("text", { x: left - 4, y: y + 4, "text-anchor": "end", class: "axis" });
    label.textContent = `${v * 100}%`;
    nodes.push(label);
  }
  let path = "";
  buckets.forEach((b, i) => {
    if (b.hit_rate === null) return;
    const x = left + (i + 0.5) * step, y = top + plotH - b.hit_rate * plotH;
    path += `${path ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    nodes.push(svg("circle", { cx: x, cy: y, r: 2.5, class: "dot" }));
  });
  if (path) nodes.unshift(svg("path", { d: path, class: "line" }));
  chart.replaceChildren(...nodes);
}

function shareRows(counts, total, labeler) {
  return Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, n]) =>
    el("tr", { "data-key": k }, el("td", {}, labeler ? labeler(k) : k), el("td", { class: "n" }, n),
      el("td", { class: "n" }, total ? pct(n / total) : "—")));
}

function drawTraffic(state) {
  drawBars(state);
  drawHits(state);
  const m = state.traffic.last_minute;
  const routed = Object.values(m.reasons).reduce((s, n) => s + n, 0);
  fill(document.querySelector("#reasons tbody"), shareRows(m.reasons, routed));
  fill(document.querySelector("#destinations tbody"), shareRows(m.workers, routed, shortUrl));
  const sheds = Object.entries(m.sheds).map(([r, n]) => `${r} ${n}`).join(", ") || "none";
  fill(document.querySelector("#minute tbody"), [
    el("tr", {}, el("th", {}, "requests"), el("td", { id: "minute-requests" }, m.requests)),
    el("tr", {}, el("th", {}, "hit rate"), el("td", { id: "minute-hit-rate" }, pct(m.hit_rate))),
    el("tr", {}, el("th", {}, "5xx errors"), el("td", {}, m.errors)),
    el("tr", {}, el("th", {}, "retries"), el("td", {}, m.retries)),
    el("tr", {}, el("th", {}, "refused"), el("td", { id: "minute-sheds" }, sheds)),
  ]);
}

function drawTotals(state) {
  const lookups = Object.fromEntries(state.sessions.lookups.map((x) => [x.labels[0], x.value]));
  const looked = (lookups.hit || 0) + (lookups.miss || 0);
  fill(document.querySelector("#sessions tbody"), [
    el("tr", {}, el("th", {}, "affinities held"), el("td", { id: "affinities" }, num(state.sessions.affinities))),
    el("tr", {}, el("th", {}, "lookups: hit / miss / error"),
      el("td", {}, `${lookups.hit || 0} / ${lookups.miss || 0} / ${lookups.error || 0}`)),
    el("tr", {}, el("th", {}, "sticky share"), el("td", {}, looked ? pct((lookups.hit || 0) / looked) : "—")),
    el("tr", {}, el("th", {}, "in flight / queued"), el("td", {}, `${state.in_flight} / ${state.queued}`)),
  ]);
  const empty = (cols, text) => [el("tr", {}, el("td", { colspan: cols, class: "muted" }, text))];
  const sheds = state.totals.sheds;
  fill(document.querySelector("#sheds tbody"), sheds.length ? sheds.map((s) =>
    el("tr", {}, el("td", {}, s.labels[0]), el("td", {}, s.labels[1]), el("td", { class: "n" }, s.value)))
    : empty(3, "nothing refused"));
  const moved = new Map(state.totals.sessions_moved.map((s) => [s.labels.join("|"), s.value]));
  const migr = state.totals.migrations;
  fill(document.querySelector("#migrations tbody"), migr.length ? migr.map((s) =>
    el("tr", {}, el("td", {}, shortUrl(s.labels[0])), el("td", {}, s.labels[1]),
      el("td", { class: "n" }, s.value), el("td", { class: "n" }, moved.get(s.labels.join("|")) || 0)))
    : empty(4, "no migration"));
  const off = state.totals.offloads;
  fill(document.querySelector("#offloads tbody"), off.length ? off.map((s) =>
    el("tr", {}, el("td", {}, shortUrl(s.labels[0])), el("td", {}, s.labels[1]), el("td", { class: "n" }, s.value)))
    : empty(3, "no KV offload"));
}

function drawRollouts(state) {
  const box = document.getElementById("rollouts");
  if (!state.rollouts.length) {
    box.replaceChildren(el("p", { class: "muted" }, "no rollout"));
    return;
  }
  box.replaceChildren(...state.rollouts.slice().reverse().map((r) => {
    const steps = el("ol", { class: "steps" }, ...r.steps.map((w, i) =>
      el("li", { class: i + 1 < r.step ? "done" : i + 1 === r.step ? "current" : "" }, `${w}%`)));
    const weights = Object.entries(r.weights).map(([v, w]) => `${v} ${num(w, 0)}%`).join(" / ");
    const gates = el("table", { class: "gates" },
      el("thead", {}, el("tr", {}, el("th", {}, "gate"), el("th", {}, "observed"), el("th", {}, "bound"),
        el("th", {}, "samples"), el("th", {}, "verdict"))),
      el("tbody", {}, ...(r.gates.length ? r.gates.map((g) =>
        el("tr", { "data-gate": g.name }, el("td", {}, g.name), el("td", { class: "n" }, num(g.observed, 3)),
          el("td", { class: "n" }, num(g.bound, 3)), el("td", { class: "n" }, g.samples),
          el("td", {}, el("span", { class: `badge v-${g.verdict}` }, g.verdict))))
        : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "not evaluated yet"))])));
    const history = el("ul", { class: "history" }, ...r.history.slice().reverse().map((h) =>
      el("li", {}, `${new Date(h.at * 1000).toLocaleTimeString()} — ${h.reason}: step ${h.step}, ` +
        `canary ${num(h.canary_weight, 0)}%${h.failed.length ? `, failed ${h.failed.join(", ")}` : ""}` +
        `${h.message ? ` (${h.message})` : ""}`)));
    const progress = r.min_requests_per_step
      ? `${r.step_requests}/${r.min_requests_per_step} requests, ${secs(r.step_elapsed_s)} of ≥ ${secs(r.min_step_duration_s)} in this step`
      : "";
    return el("article", { class: "rollout", "data-rollout": r.rollout },
      el("h3", {}, `${r.rollout}: ${r.model} ${r.baseline} → ${r.canary} `,
        el("span", { class: `badge s-${r.state}`, "data-field": "state" }, r.state),
        r.pause_reason ? el("span", { class: "muted" }, ` (${r.pause_reason})`) : null),
      el("p", {}, el("span", { "data-field": "step" }, `step ${r.step} of ${r.steps.length}`), " — weights ",
        el("span", { "data-field": "weights" }, weights), progress ? ` — ${progress}` : ""),
      steps,
      el("p", { class: "muted" }, "A gate whose observed value crosses its bound rolls the canary back; " +
        "too few samples is inconclusive and pauses."),
      gates,
      r.message ? el("p", { class: "message" }, r.message) : null,
      el("details", { open: "" }, el("summary", {}, `history (${r.history.length})`), history));
  }));
}

function drawModels(state) {
  const rows = [];
  for (const [model, m] of Object.entries(state.models)) {
    const versions = m.weights ? Object.entries(m.weights) : Object.keys(m.workers).map((v) => [v, null]);
    const total = m.weights ? Object.values(m.weights).reduce((s, w) => s + w, 0) : 0;
    for (const [v, w] of versions) {
      rows.push(el("tr", {}, el("td", {}, model), el("td", {}, v),
        el("td", { class: "n" }, w === null ? "—" : pct(total ? w / total : 0)), el("td", {}, m.stable === v ? "✓" : "")));
    }
  }
  fill(document.querySelector("#models tbody"), rows);
}

function draw(state) {
  const m = state.traffic.last_minute;
  const healthy = state.workers.filter((w) => w.health === "healthy" || w.health === "degraded").length;
  document.getElementById("summary").textContent =
    `${state.policy} policy · ${healthy}/${state.workers.length} workers routable · ` +
    `${m.requests} requests in the last minute · hit rate ${pct(m.hit_rate)}` +
    (state.draining ? " · DRAINING" : "");
  drawFleet(state);
  drawTraffic(state);
  drawTotals(state);
  drawRollouts(state);
  drawModels(state);
  document.getElementById("updated").textContent = `updated ${new Date(state.now * 1000).toLocaleTimeString()}`;
  document.body.dataset.updated = String(state.now);
}

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("main").hidden = true;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("summary").textContent = "the dashboard needs the admin token";
}

let timer = null;

async function refresh() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  try {
    const resp = await fetch("/dashboard/state.json", { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      const body = await resp.json().catch(() => ({}));
      showLogin(token ? (body.error && body.error.message) || "wrong token" : "");
      return;
    }
    if (!resp.ok) throw new Error(`state.json: HTTP ${resp.status}`);
    const state = await resp.json();
    document.getElementById("login").hidden = true;
    document.getElementById("main").hidden = false;
    draw(state);
  } catch (err) {
    document.getElementById("updated").textContent = `refresh failed: ${err.message}`;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  clearTimeout(timer);
  refresh();
});

refresh();
