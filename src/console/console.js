// refusal-gate's console: the fleet, alerts, interfaces and health (`/`), and one client's
// story (`/clients/NAME`), read from the admin API and refreshed every two seconds. In a
// report written by `replay --format html` the same views read the data inlined in the page
// (`#report`) and route by the URL's fragment instead.
"use strict";

const inlined = document.getElementById("report");
const REPORT = inlined ? JSON.parse(inlined.textContent) : null;
const CLASSES = ["ok", "refusal", "transient", "throttled", "ambiguous"];
const VIOLATIONS = ["retry_after_refusal", "retry_without_discovery", "retry_after_ambiguous",
  "retry_budget_exhausted", "retry_before_retry_after", "probe_after_refusal"];
const state = { client: "", interface: "", sort: "avoidable", order: "desc", offset: 0, limit: 50 };
let last = null; // the previous status, for rates
let timer = null;

const main = () => document.getElementById("main");
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) =>
  ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const num = (n) => Number(n || 0).toLocaleString("en");
const when = (secs) => secs ? new Date(secs * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "–";
const clientHref = (c) => REPORT ? `#/clients/${encodeURIComponent(c)}` : `/clients/${encodeURIComponent(c)}`;

function route() {
  const path = REPORT ? (location.hash.slice(1) || "/") : location.pathname;
  const m = path.match(/^\/clients\/(.+)$/);
  return m ? { client: decodeURIComponent(m[1]) } : {};
}

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem("refusal-gate-token");
  if (token) headers.authorization = `Bearer ${token}`;
  const answer = await fetch(path, { headers });
  if (answer.status === 401) {
    askToken();
    throw new Error("unauthorized");
  }
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

function askToken() {
  clearInterval(timer);
  main().innerHTML = document.getElementById("token-form").innerHTML;
  document.getElementById("token").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("refusal-gate-token", e.target.token.value);
    start();
  });
}

// --- the fleet ---------------------------------------------------------------------------

function localFleet(status) {
  // The report's rows, filtered, sorted and paged as the API does it.
  let rows = status.fleet.rows.rows.filter((r) =>
    r.client.includes(state.client) && r.interface.includes(state.interface));
  const key = (r) => ["client", "interface"].includes(state.sort) ? r[state.sort]
    : (r[state.sort] ?? r.classes[state.sort] ?? (r.violations[state.sort] || 0));
  rows.sort((a, b) => {
    const [x, y] = [key(a), key(b)];
    const c = x < y ? -1 : x > y ? 1 : 0;
    return (state.order === "asc" ? c : -c) || a.client.localeCompare(b.client);
  });
  return { total: rows.length, offset: state.offset, limit: state.limit,
    rows: rows.slice(state.offset, state.offset + state.limit) };
}

function chart(top) {
  const shown = top.filter((t) => t.avoidable > 0);
  if (!shown.length) return `<p class="muted">No avoidable requests yet.</p>`;
  const max = Math.max(...shown.map((t) => t.avoidable));
  const h = 22, w = 560, label = 170;
  const bars = shown.map((t, i) => {
    const len = Math.max(2, (w - label - 60) * t.avoidable / max);
    return `<g transform="translate(0 ${i * h})"><title>${esc(t.client)}: ${t.avoidable} avoidable of ${t.attempts}</title>
      <text x="${label - 6}" y="15" text-anchor="end"><a href="${clientHref(t.client)}">${esc(t.client).slice(0, 26)}</a></text>
      <rect x="${label}" y="3" width="${len}" height="15" class="class-refusal"></rect>
      <text x="${label + len + 5}" y="15">${num(t.avoidable)}</text></g>`;
  }).join("");
  return `<svg id="top-chart" width="${w}" height="${shown.length * h + 4}" role="img" aria-label="top clients by avoidable requests">${bars}</svg>`;
}

function alertsHtml(alerts) {
  if (!alerts.length) return `<p class="muted">No alert is firing.</p>`;
  return alerts.map((a) => `<div class="alert ${esc(a.severity)}" data-alert="${esc(a.alertname)}">
    <span class="name">${esc(a.alertname)}</span><span class="sev">${esc(a.severity)}</span><br>
    ${a.client
      ? `<a href="${clientHref(a.client)}">${esc(a.client)}</a> on ${esc(a.interface)}: ${esc(a.summary)}
    — <code>${esc(a.operation)}</code>`
      : `${esc(a.summary)}`}
    ${a.trace_url ? ` — <a href="${esc(a.trace_url)}">trace</a>` : ""}
    <span class="muted">since ${when(a.starts_at)}</span></div>`).join("");
}

function table(page) {
  const cols = [["client", "client"], ["interface", "interface"], ["attempts", "attempts"],
    ...CLASSES.map((c) => [c, c]), ["avoidable", "avoidable"],
    ...VIOLATIONS.map((v) => [v, v.replace(/_/g, " ")]), ["honored", "honored"],
    ["last_violation", "last violation"]];
  const head = cols.map(([k, t]) => `<th data-sort="${k}" class="${state.sort === k ? "sorted " + state.order : ""}">${t}</th>`).join("");
  const rows = page.rows.map((r) => `<tr data-client="${esc(r.client)}" data-avoidable="${r.avoidable}">
    <td><a href="${clientHref(r.client)}">${esc(r.client)}</a></td><td>${esc(r.interface)}</td>
    <td>${num(r.attempts)}</td>${CLASSES.map((c) => `<td>${num(r.classes[c])}</td>`).join("")}
    <td class="${r.avoidable ? "bad" : ""}">${num(r.avoidable)}</td>
    ${VIOLATIONS.map((v) => `<td>${num(r.violations[v])}</td>`).join("")}
    <td>${num(r.honored)}</td><td>${r.last_violation_trace_url
      ? `<a href="${esc(r.last_violation_trace_url)}" data-trace="${esc(r.last_violation_trace)}" title="the latest violation's trace">${when(r.last_violation)}</a>`
      : when(r.last_violation)}</td></tr>`).join("");
  const to = Math.min(page.offset + page.rows.length, page.total);
  return `<div class="filters">
      <input id="f-client" placeholder="client contains" value="${esc(state.client)}">
      <input id="f-interface" placeholder="interface contains" value="${esc(state.interface)}">
      <span class="muted">${page.total ? page.offset + 1 : 0}–${to} of ${num(page.total)}</span>
      <button id="prev" ${page.offset ? "" : "disabled"}>◀</button>
      <button id="next" ${to < page.total ? "" : "disabled"}>▶</button></div>
    <div style="overflow-x:auto"><table id="fleet"><thead><tr>${head}</tr></thead><tbody>${rows}</tbody></table></div>`;
}

// Where an interface refused an operation and served it, or was at odds with its document
// (DESIGN §13): its refusals may not be authoritative. Each with the calls' traces.
function contradictionsHtml(list) {
  if (!list.length) return "–";
  return `<ul class="contradictions">${list.map((c) => `<li data-kind="${esc(c.kind)}">${esc(c.kind)}: <code>${esc(c.operation)}</code>
    <span class="muted">${when(c.at)}</span>${c.traces.map((t, n) => t.trace_url
      ? ` <a href="${esc(t.trace_url)}" data-trace="${esc(t.trace_id)}">${n ? "the other call" : "trace"}</a>`
      : ` <code data-trace="${esc(t.trace_id)}">${esc(t.trace_id.slice(0, 8))}</code>`).join("")}</li>`).join("")}</ul>`;
}

function interfacesHtml(list) {
  if (!list.length) return `<p class="muted">No interface is configured: each origin is an interface of its own, declaring nothing.</p>`;
  return `<table id="interfaces"><thead><tr><th>name</th><th>protocol</th><th>serves from</th><th>declares</th><th>server view</th><th>document</th><th>contradicted itself</th></tr></thead><tbody>${
    list.map((i) => `<tr><td>${esc(i.name)}</td><td>${esc(i.protocol)}</td><td>${i.bases.map(esc).join("<br>")}</td>
      <td style="text-align:left">${i.declared.length ? i.declared.map((p) => `<code>${esc(p)}</code>`).join(" ") : "–"}</td>
      <td>${i.server_view ? "yes" : "–"}</td>
      <td style="text-align:left">${i.document ? `${esc(i.document.outcome)} ${esc(i.document.source)} <span class="muted">${when(i.document.at)}</span>${i.document.error ? `<br><span class="muted">${esc(i.document.error)}</span>` : ""}` : "–"}</td>
      <td style="text-align:left">${contradictionsHtml(i.contradictions || [])}</td></tr>`).join("")}</tbody></table>`;
}

function healthHtml(h, now) {
  let rate = "";
  if (last && now > last.now) {
    const dt = now - last.now;
    rate = ` <span class="muted">(${num(Math.round((h.accepted_spans - last.health.accepted_spans) / dt))}/s accepted, ${num(Math.round((h.refused_spans - last.health.refused_spans) / dt))}/s refused)</span>`;
  }
  return `<div class="figures" id="health">
    <div class="figure"><b>${num(h.accepted_spans)}</b>spans accepted${rate}</div>
    <div class="figure"><b>${num(h.refused_spans)}</b>spans refused</div>
    <div class="figure"><b>${num(h.tracker_keys)}</b>tracker keys</div>
    <div class="figure"><b>${num(h.evictions)}</b>keys evicted</div>
    <div class="figure"><b>${num(h.queue_spans)}</b>spans queued to forward</div></div>`;
}

function renderFleet(status) {
  const page = REPORT ? localFleet(status) : status.fleet.rows;
  const t = status.fleet.totals;
  main().innerHTML = `<h1>The fleet</h1>
    <div class="figures"><div class="figure"><b>${num(t.clients)}</b>clients</div>
      <div class="figure"><b>${num(t.attempts)}</b>attempts</div>
      <div class="figure"><b id="avoidable-total">${num(t.avoidable)}</b>avoidable requests</div>
      <div class="figure"><b>${num(status.alerts.length)}</b>alerts firing</div></div>
    <div class="grid"><section class="card"><h2>Top clients by avoidable requests</h2>${chart(status.fleet.top)}</section>
      <section class="card"><h2>Firing alerts</h2><div id="alerts">${alertsHtml(status.alerts)}</div></section></div>
    <h2>Clients and interfaces</h2>${table(page)}
    <h2>Interfaces</h2>${interfacesHtml(status.interfaces)}
    <h2>Receivers</h2>${REPORT ? `<p class="muted">${num(REPORT.spans)} spans replayed from ${esc(REPORT.files.join(", "))}.</p>` : healthHtml(status.health, status.now)}`;
  for (const th of main().querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const k = th.dataset.sort;
      state.order = state.sort === k && state.order === "desc" ? "asc" : "desc";
      state.sort = k; state.offset = 0; refresh();
    });
  }
  for (const [id, key] of [["f-client", "client"], ["f-interface", "interface"]]) {
    const input = document.getElementById(id);
    input.addEventListener("change", () => { state[key] = input.value; state.offset = 0; refresh(); });
  }
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); refresh(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; refresh(); });
  last = status;
}

// --- one client's story --------------------------------------------------------------------

function timeline(attempts, from, to) {
  const w = 640, span = Math.max(1, to - from);
  const dots = attempts.map((a) => {
    const x = 10 + (w - 20) * (a.start - from) / span;
    const title = `${a.kind}${a.violation ? " — " + a.violation : ""}, attempt ${a.attempt}, ${new Date(a.start / 1e6).toISOString()}`;
    return `<circle cx="${x.toFixed(1)}" cy="14" r="${a.violation ? 7 : 5}" class="class-${a.class}"
      ${a.violation ? 'stroke="#000" stroke-width="2"' : ""}><title>${esc(title)}</title></circle>`;
  }).join("");
  return `<svg width="${w}" height="28"><line x1="4" y1="14" x2="${w - 4}" y2="14" stroke="#bdbdbd"></line>${dots}</svg>`;
}

function renderStory(story) {
  const all = story.interfaces.flatMap((i) => i.operations.flatMap((o) => o.attempts));
  const from = Math.min(...all.map((a) => a.start)), to = Math.max(...all.map((a) => a.start));
  const figures = story.figures.map((r) => `<tr><td>${esc(r.interface)}</td><td>${num(r.attempts)}</td>
    ${CLASSES.map((c) => `<td>${num(r.classes[c])}</td>`).join("")}<td class="${r.avoidable ? "bad" : ""}">${num(r.avoidable)}</td><td>${num(r.honored)}</td></tr>`).join("");
  const interfaces = story.interfaces.map((i) => `<section class="card"><h2>${esc(i.interface)}</h2>
    <p class="muted">${i.first_read ? `read the discovery document at ${new Date(i.first_read / 1e6).toISOString()}` : "never read the discovery document"}</p>
    ${i.operations.map((o) => `<div class="op"><h3>${esc(o.operation)}</h3>${timeline(o.attempts, from, to)}
      <ul class="story">${o.story.map((s) => `<li data-violation="${esc(s.violation)}">${esc(s.text).replace(/`([^`]+)`/g, "<code>$1</code>")}
        — <span class="instead">the decision boundary: ${esc(s.instead)}</span></li>`).join("")}</ul></div>`).join("")}</section>`).join("");
  main().innerHTML = `<p><a href="${REPORT ? "#/" : "/"}">← the fleet</a></p>
    <h1 id="story-client">${esc(story.client)}</h1>
    <table><thead><tr><th>interface</th><th>attempts</th>${CLASSES.map((c) => `<th>${c}</th>`).join("")}<th>avoidable</th><th>honored</th></tr></thead><tbody>${figures}</tbody></table>
    <p class="legend">${CLASSES.map((c) => `<span><i class="dot class-${c}"></i>${c}</span>`).join("")}<span>ringed: a violation</span>
      <span class="muted">(the latest attempts the tracker keeps of each operation)</span></p>
    <div id="story">${interfaces || `<p class="muted">The tracker keeps no attempt of this client.</p>`}</div>`;
}

// --- refreshing ----------------------------------------------------------------------------

async function refresh() {
  const r = route();
  try {
    if (r.client !== undefined) {
      const story = REPORT ? REPORT.clients[r.client] : await api(`/api/v1/clients/${encodeURIComponent(r.client)}`);
      if (story) renderStory(story);
      else main().innerHTML = `<p>No client named <b>${esc(r.client)}</b>.</p>`;
    } else {
      const q = new URLSearchParams({ client: state.client, interface: state.interface, sort: state.sort,
        order: state.order, offset: state.offset, limit: state.limit });
      renderFleet(REPORT ? REPORT.status : await api(`/api/v1/status?${q}`));
    }
    document.getElementById("updated").textContent = REPORT ? "report" : `updated ${new Date().toLocaleTimeString()}`;
    // When the first view was on screen, in milliseconds since the page was asked for.
    if (!document.body.dataset.shownMs) document.body.dataset.shownMs = Math.round(performance.now());
  } catch (e) {
    if (e.message !== "unauthorized") document.getElementById("updated").textContent = `error: ${e.message}`;
  }
}

function start() {
  clearInterval(timer);
  refresh();
  if (!REPORT) timer = setInterval(() => {
    // Not while a person types in a filter.
    if (!document.activeElement || document.activeElement.tagName !== "INPUT") refresh();
  }, 2000);
}

window.addEventListener("hashchange", refresh);
start();
