// Gateway dashboard: polls /admin/stats and renders it. No framework, no build step.
// With GATEWAY_ADMIN_KEY set, the key is asked once (or taken from ?key=) and kept in
// sessionStorage for this tab only.
"use strict";

const KEY_ITEM = "gateway-admin-key";
const params = new URLSearchParams(location.search);
const intervalMs = Math.max(500, Number(params.get("interval") || 2000));
let timer = null;

if (params.has("key")) {
  sessionStorage.setItem(KEY_ITEM, params.get("key"));
  params.delete("key");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
}

function headers() {
  const key = sessionStorage.getItem(KEY_ITEM);
  return key ? { Authorization: "Bearer " + key } : {};
}

// Build an element with text only (never innerHTML: request ids come from clients).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  }
  return node;
}

const $ = (id) => document.getElementById(id);
const ms = (v) => (v == null ? "–" : v < 10 ? v.toFixed(2) + " ms" : Math.round(v) + " ms");
const pct = (v) => (100 * v).toFixed(1) + "%";

function showKeyForm(message) {
  $("main").hidden = true;
  $("keyform").hidden = false;
  $("keyerror").textContent = message || "";
  $("poll").textContent = "admin key needed";
  $("poll").className = "pill bad";
}

$("keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY_ITEM, $("key").value);
  $("keyform").hidden = true;
  poll();
});

async function poll() {
  clearTimeout(timer);
  try {
    const resp = await fetch("/admin/stats", { headers: headers(), cache: "no-store" });
    if (resp.status === 401) {
      const had = sessionStorage.getItem(KEY_ITEM);
      sessionStorage.removeItem(KEY_ITEM);
      showKeyForm(had ? "That key was refused." : "");
      return;
    }
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    render(await resp.json());
    const usage = await fetch("/admin/usage", { headers: headers(), cache: "no-store" });
    if (usage.ok) renderTenants(await usage.json());
    $("poll").textContent = "live · " + new Date().toLocaleTimeString();
    $("poll").className = "pill ok";
  } catch (err) {
    $("poll").textContent = "unreachable: " + err.message;
    $("poll").className = "pill bad";
  }
  timer = setTimeout(poll, intervalMs);
}

async function act(path, body) {
  const opts = { method: "POST", headers: { ...headers(), "Content-Type": "application/json" } };
  if (body) opts.body = JSON.stringify(body);
  const resp = await fetch(path, opts);
  if (!resp.ok) alert("Failed: HTTP " + resp.status);
  poll();
}

function render(s) {
  $("main").hidden = false;
  const p = s.policy;
  $("policy").textContent =
    `policy ${p.version} · ${p.source} · reloads ${p.reloads} (${p.reload_failures} refused)` +
    ` · up ${Math.round(s.uptime_s)} s`;
  renderTraffic(s.traffic);
  renderPools(s.pools);
}

function renderTraffic(t) {
  if (!t) {
    $("rate").textContent = "off";
    return;
  }
  $("rate").textContent = t.rate_per_s.toFixed(2);
  $("p50").textContent = ms(t.latency_ms.p50);
  $("p99").textContent = ms(t.latency_ms.p99);
  $("ttft").textContent = ms(t.ttft_ms.p50);
  $("errors").textContent = `${t.errors} (${pct(t.error_ratio)})`;
  $("cache").textContent = `${t.cache_hits} (${pct(t.cache_hit_ratio)})`;
  $("degraded").textContent = t.degraded;
  $("shed").textContent = t.shed;
  $("total-requests").textContent = t.total_requests;
  const top = Math.max(1, ...t.per_second);
  const step = 600 / Math.max(1, t.per_second.length - 1);
  $("sparkline").setAttribute(
    "points",
    t.per_second.map((v, i) => `${(i * step).toFixed(1)},${(58 - (56 * v) / top).toFixed(1)}`).join(" "),
  );
  const rows = t.recent.map((d) =>
    el("tr", { class: d.status >= 500 ? "err" : "" },
      el("td", { class: "num" }, d.age_s + " s"),
      el("td", {}, d.request_id.slice(0, 16)),
      el("td", {}, d.tenant),
      el("td", {}, d.alias),
      el("td", {}, d.class),
      el("td", {}, d.pool ? `${d.pool} → ${d.provider}` : "–"),
      el("td", { class: "num" }, d.attempts),
      el("td", {}, d.cache),
      el("td", {}, d.degraded ? `${d.status} degraded` : d.status),
      el("td", { class: "num" }, d.total_ms.toFixed(1)),
      el("td", { class: "num" }, d.ttft_ms == null ? "–" : d.ttft_ms.toFixed(1)),
      el("td", {}, d.failures.join(", ")),
    ),
  );
  document.querySelector("#recent tbody").replaceChildren(...rows);
}

function memberRow(m) {
  const state = m.drained ? "drained" : m.auth_failed ? "auth_failed" : m.breaker.state;
  const last = m.last_error ? `${m.last_error.kind} (${m.last_error.age_s} s ago)` : "";
  const name = encodeURIComponent(m.name);
  return el("tr", { "data-member": m.name },
    el("td", {}, el("span", { class: "dot " + state, title: state }), m.name),
    el("td", {}, state),
    el("td", { class: "num" }, ms(m.ewma_ms)),
    el("td", { class: "num" }, m.inflight + (m.max_inflight ? " / " + m.max_inflight : "")),
    el("td", { class: "num" }, m.attempts),
    el("td", { class: "num" }, m.failures),
    el("td", {}, last),
    el("td", {},
      el("button", { onclick: () => act(`/admin/members/${name}/${m.drained ? "undrain" : "drain"}`) },
        m.drained ? "undrain" : "drain"),
      " ",
      el("button", {
        onclick: () => act(`/admin/members/${name}/breaker`,
          { state: m.breaker.state === "closed" ? "open" : "closed" }),
      }, m.breaker.state === "closed" ? "open breaker" : "close breaker"),
    ),
  );
}

function renderPools(pools) {
  const cards = pools.map((pool) => {
    const q = pool.queue;
    const meta = `${pool.strategy} · ${pool.latency_signal} · healthy ${pool.healthy}/` +
      `${pool.members.length} · queue ${q.depth} · shed ${q.shed}` +
      (pool.fallback.length ? ` · falls back to ${pool.fallback.join(", ")}` : "");
    return el("div", { class: "pool", "data-pool": pool.name },
      el("h3", {}, pool.name, el("span", { class: "meta" }, meta)),
      el("table", {},
        el("thead", {}, el("tr", {}, ...["member", "state", "EWMA", "in flight", "attempts",
          "failures", "last error", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...pool.members.map((m) => (typeof m === "string" ? el("tr", {}, el("td", {}, m)) : memberRow(m)))),
      ),
    );
  });
  $("pools").replaceChildren(...cards);
}

// Used / limit with a bar; "–" when the limit is not set.
function meter(used, limit, fmt) {
  if (limit == null) return el("td", { class: "num muted" }, "–");
  const share = limit ? Math.min(1, used / limit) : 0;
  const level = share >= 1 ? "bad" : share >= 0.8 ? "warn" : "ok";
  return el("td", { class: "num" },
    `${fmt(used)} / ${fmt(limit)}`,
    el("span", { class: "bar" }, el("span", { class: level, style: `width:${(100 * share).toFixed(0)}%` })));
}

const count = (v) => String(Math.round(v));
const usd = (v) => "$" + (v < 1 ? v.toFixed(4) : v.toFixed(2));

function renderTenants(u) {
  const rows = u.tenants.map((t) => {
    const lim = Object.fromEntries(t.limits.map((l) => [l.name, l]));
    const bucket = (name) => {
      const l = lim[name];
      return l ? meter(l.limit - l.remaining, l.limit, count) : meter(0, null, count);
    };
    const cc = lim.concurrent;
    const budgets = t.budgets.length
      ? t.budgets.map((b) => `${b.period}: ${usd(b.spent_usd)} / ${usd(b.limit_usd)}` +
        (b.spent_usd >= b.limit_usd ? " (over)" : b.spent_usd >= b.soft_usd ? " (soft)" : "")).join(" · ")
      : "–";
    return el("tr", { "data-tenant": t.tenant },
      el("td", {}, t.tenant),
      bucket("requests_per_minute"),
      bucket("tokens_per_minute"),
      cc ? meter(cc.in_flight, cc.limit, count) : meter(0, null, count),
      el("td", {}, budgets),
      el("td", { class: "num" }, t.admitted),
      el("td", { class: "num" }, t.refused),
      el("td", { class: "num" }, usd(t.cost_usd)),
    );
  });
  document.querySelector("#tenants tbody").replaceChildren(...rows);
  $("limits-mode").textContent = u.local_mode
    ? "Redis unreachable: this process enforces its share of each limit alone."
    : `Limits shared by ${u.processes} gateway process(es); figures from the process that answered.`;
}

poll();
