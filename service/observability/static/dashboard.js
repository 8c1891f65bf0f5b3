"use strict";
// The dashboard: overview by policy version, per-dataset / per-component views, a group browser with a
// transcript viewer, the trainer view. Everything comes from the public API; nothing from elsewhere.
const KEY = "grpo-curator-api-key";
const { lineChart, fmt } = window.Charts;
const main = document.getElementById("main");

function el(tag, attrs = {}, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") n.className = v; else if (k.startsWith("on")) n[k] = v; else n.setAttribute(k, v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined) n.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return n;
}

// The API key lives in this tab's sessionStorage (gone when the tab closes), entered in a form on the page
// (no window.prompt: a headless browser or a screenshot tool can fill it like any other field).
const getKey = () => sessionStorage.getItem(KEY);
class NeedKey extends Error {}

function keyForm(reason) {
  const input = el("input", { type: "password", id: "key-input", name: "key", size: 40, autocomplete: "off",
    placeholder: "a viewer key is enough" });
  const save = (e) => {
    e.preventDefault();
    if (input.value) sessionStorage.setItem(KEY, input.value.trim()); else sessionStorage.removeItem(KEY);
    render();
  };
  return el("form", { id: "key-form", class: "filters", onsubmit: save },
    el("p", {}, reason), el("label", {}, "API key ", input), el("button", { type: "submit" }, "Use this key"),
    getKey() ? el("button", { type: "button", onclick: () => { sessionStorage.removeItem(KEY); render(); } }, "Forget it") : null);
}

async function api(path) {
  const key = getKey();
  const r = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
  if (r.status === 401) throw new NeedKey(key ? "That API key was not accepted: enter another." : "This service needs an API key.");
  if (!r.ok) {
    let msg = r.statusText;
    try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new Error(`${path}: ${r.status} ${msg}`);
  }
  return r.json();
}

const pct = (v) => fmt(v, "%");
const sum = (o) => (o ? Object.values(o).reduce((a, b) => a + b, 0) : null);
const byKey = (rows) => rows.map((r) => ({ ...r, x: Number(r.key) })).filter((r) => Number.isFinite(r.x));

function card(label, value) {
  return el("div", { class: "card" }, el("div", { class: "v" }, value), el("div", { class: "l" }, label));
}

function table(headers, rows, numeric = []) {
  const t = el("table", {}, el("tr", {}, headers.map((h, i) => el("th", { class: numeric.includes(i) ? "num" : "" }, h))));
  for (const row of rows) t.append(el("tr", {}, row.map((c, i) => el("td", { class: numeric.includes(i) ? "num" : "" }, c))));
  return t;
}

function series(rows, pick) { return rows.map((r) => [r.x, pick(r) ?? null]); }

function keysOf(rows, field) {
  return [...new Set(rows.flatMap((r) => Object.keys(r[field] || {})))].sort();
}

function versionCharts(grid, rows, xLabel) {
  const opts = { xLabel, series: [] };
  lineChart(grid, { ...opts, title: "Outcome (pass rate) and total reward", yLabel: "reward", series: [
    { name: "pass rate", points: series(rows, (r) => r.pass_rate) },
    { name: "mean total", points: series(rows, (r) => r.total && r.total.mean) }] });
  lineChart(grid, { ...opts, title: "Zero-variance and drop rates", unit: "%", yMin: 0, series: [
    { name: "zero variance", points: series(rows, (r) => r.zero_variance_fraction) },
    { name: "dropped (all reasons)", points: series(rows, (r) => sum(r.drop_fraction)) }] });
  lineChart(grid, { ...opts, title: "Truncation rate by cause", unit: "%", yMin: 0,
    series: keysOf(rows, "truncation_rate").map((k) => ({ name: k, points: series(rows, (r) => (r.truncation_rate || {})[k] ?? 0) })) });
  lineChart(grid, { ...opts, title: "Response length", yLabel: "length", unit: "tokens", yMin: 0, series: [
    { name: "mean", points: series(rows, (r) => r.length && r.length.mean) },
    { name: "p90", points: series(rows, (r) => r.length && r.length.p90) }] });
  lineChart(grid, { ...opts, title: "Length–reward correlation", yLabel: "Pearson r", yMin: -1, yMax: 1, series: [
    { name: "r(length, total)", points: series(rows, (r) => r.length_reward_corr) }] });
}

async function overview() {
  const [summary, stats] = await Promise.all([api("/v1/summary"), api("/v1/stats?by=policy_version")]);
  const groups = summary.groups || {};
  main.append(el("h2", {}, "Groups"), el("div", { class: "cards", id: "cards" },
    ["received", "scored", "ready", "leased", "consumed", "dropped", "reward_error"].map((s) => card(s, groups[s] || 0)),
    card("active leases", summary.active_leases), card("policy version", summary.policy_version)));
  const drops = Object.entries(summary.drop_reasons || {});
  const dropped = (groups.dropped || 0) + (groups.reward_error || 0);
  main.append(el("h2", {}, `Dropped groups by reason (${dropped})`),
    drops.length ? table(["reason", "groups"], drops.map(([k, v]) => [k, v]), [1]) : el("p", { class: "muted" }, "none"));
  main.append(el("h2", {}, "By the policy version that sampled the group"));
  const grid = el("div", { class: "grid" });
  main.append(grid);
  versionCharts(grid, byKey(stats.rows), "policy version");
}

async function datasets() {
  const stats = await api("/v1/stats?by=dataset");
  main.append(el("h2", {}, "Datasets"), table(
    ["dataset", "trajectories", "pass rate", "mean total", "zero variance", "dropped", "truncated", "mean length"],
    stats.rows.map((r) => [el("a", { href: "#datasets/" + encodeURIComponent(r.key) }, r.key), r.count, pct(r.pass_rate),
      fmt(r.total && r.total.mean), pct(r.zero_variance_fraction), pct(sum(r.drop_fraction)), pct(sum(r.truncation_rate)),
      fmt(r.length && r.length.mean)]), [1, 2, 3, 4, 5, 6, 7]));
  const comps = await api("/v1/stats?by=component");
  main.append(el("h2", {}, "Components (all datasets)"), componentTable(comps.rows));
}

function componentTable(rows) {
  return table(["component", "values", "mean", "std", "p10", "p50", "p90", "error rate", "r(length)"],
    rows.map((r) => [r.key, r.count, fmt(r.mean), fmt(r.std), fmt(r.p10), fmt(r.p50), fmt(r.p90), pct(r.error_rate), fmt(r.length_reward_corr)]),
    [1, 2, 3, 4, 5, 6, 7, 8]);
}

async function dataset(name) {
  const q = "&dataset=" + encodeURIComponent(name);
  const [versions, comps] = await Promise.all([api("/v1/stats?by=policy_version" + q), api("/v1/stats?by=component" + q)]);
  main.append(el("h2", {}, `Dataset ${name}`), el("p", {}, el("a", { href: "#groups?dataset=" + encodeURIComponent(name) }, "browse its groups")));
  const grid = el("div", { class: "grid" });
  main.append(grid);
  versionCharts(grid, byKey(versions.rows), "policy version");
  main.append(el("h2", {}, "Components"), componentTable(comps.rows));
}

function params() {
  const q = location.hash.split("?")[1] || "";
  return Object.fromEntries(new URLSearchParams(q));
}

const FINISH = ["", "stop", "length", "max_turns", "tool_misuse", "tool_failure", "env_error", "timeout", "aborted"];

async function groups() {
  const p = params();
  const qs = new URLSearchParams();
  for (const k of ["dataset", "status", "policy_version", "drop_reason", "finish_reason", "min_reward", "max_reward", "cursor"]) if (p[k]) qs.set(k, p[k]);
  qs.set("limit", "100");
  const page = await api("/v1/groups?" + qs);
  const inputs = {};
  const field = (name, node) => { inputs[name] = node; node.value = p[name] || ""; return el("label", {}, name.replace("_", " "), node); };
  const statuses = ["", "received", "scored", "ready", "dropped", "leased", "consumed", "reward_error"];
  const go = () => {
    const q = new URLSearchParams();
    for (const [k, n] of Object.entries(inputs)) if (n.value) q.set(k, n.value);
    location.hash = "#groups?" + q;
  };
  main.append(el("h2", {}, "Groups"), el("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go(); } },
    field("dataset", el("input", { size: 14 })),
    field("status", el("select", {}, statuses.map((s) => el("option", { value: s }, s || "any")))),
    field("policy_version", el("input", { size: 5, type: "number", min: 0 })),
    field("drop_reason", el("input", { size: 14 })),
    field("finish_reason", el("select", {}, FINISH.map((s) => el("option", { value: s }, s || "any")))),
    field("min_reward", el("input", { size: 6, type: "number", step: "any" })),
    field("max_reward", el("input", { size: 6, type: "number", step: "any" })),
    el("button", { type: "submit" }, "Filter")));
  const rows = page.groups;
  main.append(table(["group", "dataset", "policy version", "status", "drop reason", "mean reward", "trajectories", "tokens", "created"],
    rows.map((g) => [el("a", { href: "#group/" + encodeURIComponent(g.id), class: "group-link" }, g.id), g.dataset, g.policy_version,
      el("span", { class: "tag " + g.status }, g.status), g.drop_reason || "", fmt(g.mean_reward ?? null), g.n_trajectories, g.n_tokens,
      g.created_at.replace("T", " ").slice(0, 19)]),
    [2, 5, 6, 7]));
  if (page.next_cursor) {
    const q = new URLSearchParams(p); q.set("cursor", page.next_cursor);
    main.append(el("p", {}, el("a", { href: "#groups?" + q }, "next page →")));
  }
}

function content(c) {
  if (c === null || c === undefined) return "";
  return typeof c === "string" ? c : JSON.stringify(c, null, 2);
}

function message(m) {
  const calls = (m.tool_calls || []).map((tc) => el("div", { class: "tool-call" },
    el("span", { class: "tag" }, "tool call " + (tc.id || "")), el("code", {}, (tc.function || {}).name || ""),
    el("pre", {}, content((tc.function || {}).arguments))));
  return el("div", { class: "msg " + m.role }, el("div", { class: "role" }, m.role + (m.tool_call_id ? ` (${m.tool_call_id})` : "")),
    el("pre", {}, content(m.content)), calls);
}

// what happened to a member: its own action, else its group's fate (a group dropped as a whole, e.g.
// untrainable or stale, leaves every member out), else nothing yet (not curated)
function memberAction(t, g) {
  if (t.action) return [t.action, t.action];
  if (g.status === "dropped" || g.status === "reward_error") return ["drop", `drop (group: ${g.drop_reason || g.status})`];
  if (["ready", "leased", "consumed"].includes(g.status)) return ["keep", "keep"];
  return ["", "no action yet"];
}

function trajectory(t, g) {
  const [actionClass, actionText] = memberAction(t, g);
  const rewards = Object.entries(t.rewards || {}).map(([name, r]) => [name, r.value === null ? "–" : fmt(r.value),
    r.error ? el("span", { class: "err" }, r.error) : "", r.latency_ms === null || r.latency_ms === undefined ? "" : r.latency_ms.toFixed(1) + " ms"]);
  return el("div", { class: "traj" },
    el("h3", {}, `Trajectory ${t.index} `, el("span", { class: "tag action " + actionClass }, actionText),
      el("span", { class: "tag" }, "finish: " + t.finish_reason)),
    el("div", { class: "cards" }, card("total reward", fmt(t.total_reward)), card("outcome", fmt(t.outcome)),
      card("advantage", fmt(t.advantage)), card("tokens", t.num_tokens), card("turns", t.num_turns)),
    t.reason ? el("p", {}, "reason: ", t.reason) : null,
    rewards.length ? table(["component", "value", "error", "latency"], rewards, [1, 3]) : el("p", { class: "muted" }, "not scored yet"),
    el("div", { class: "transcript" }, (t.messages || []).map(message)),
    el("div", { class: "final" }, el("strong", {}, "final answer: "), el("pre", {}, t.final_answer)));
}

async function group(id) {
  const g = await api("/v1/groups/" + encodeURIComponent(id) + "?include_tokens=true");
  main.append(el("h2", {}, "Group ", el("code", {}, g.id), " ", el("span", { class: "tag " + g.status }, g.status)),
    table(["prompt", "dataset", "policy version", "reward spec", "curation policy", "drop reason", "score error"],
      [[g.prompt_id, g.dataset, g.policy_version, g.reward_spec || "", g.curation_policy || "", g.drop_reason || "", g.score_error || ""]]),
    el("h2", {}, "Decision log"),
    (g.decisions || []).length ? table(["trajectory", "action", "rule", "reason", "policy", "at"],
      g.decisions.map((d) => [d.index === null ? "group" : d.index, d.action, d.rule, d.reason, d.policy || "", d.created_at.slice(0, 19)]))
      : el("p", { class: "muted" }, "no decisions yet"),
    el("h2", {}, "Prompt"),
    g.prompt_messages ? el("div", { class: "transcript prompt" }, g.prompt_messages.map(message)) : el("p", { class: "muted" }, "prompt not stored"),
    el("h2", {}, "Trajectories"), ...g.trajectories.map((t) => trajectory(t, g)));
  await agentSessions(g);
}

// A group made of agent sessions (the gateway, docs/agents.md): each session as its calls, and the tokens
// its trajectory trains on (loss mask 1 highlighted; mask 0 is the prompt, tool output and template).
const MAX_TOKENS_SHOWN = 4000;

function tokenStrip(ids, mask) {
  const shown = ids.slice(0, MAX_TOKENS_SHOWN);
  const strip = el("div", { class: "tokens" }, shown.map((id, i) =>
    el("span", { class: mask[i] === 1 ? "tok trained" : "tok", title: `position ${i}, mask ${mask[i]}` }, id)));
  if (ids.length > shown.length) strip.append(el("span", { class: "muted" }, ` … ${ids.length - shown.length} more`));
  return strip;
}

function trainedTokens(t) {
  const parts = t.segments && t.segments.length ? t.segments : [t];
  const strips = parts.filter((s) => s.token_ids && s.loss_mask).map((s, i) => el("div", { class: "segment" },
    parts.length > 1 ? el("div", { class: "muted" }, `segment ${i}`) : null,
    el("div", { class: "muted" }, `${s.loss_mask.filter((m) => m === 1).length} of ${s.token_ids.length} tokens trained`),
    tokenStrip(s.token_ids, s.loss_mask)));
  return strips.length ? strips : [el("p", { class: "muted" }, "no tokens recorded (no call was answered)")];
}

function sessionView(s, t) {
  const calls = s.calls.map((c) => [c.index, c.kind, c.prompt_tokens, c.completion_tokens, c.finish_reason || "",
    c.latency_ms === null || c.latency_ms === undefined ? "" : c.latency_ms.toFixed(1) + " ms", c.attempts,
    c.error ? el("span", { class: "err" }, c.error) : (c.misuse ? el("span", { class: "err" }, "misuse: " + c.misuse) : "")]);
  return el("div", { class: "traj session", "data-session": s.session_id },
    el("h3", {}, "Session ", el("code", {}, s.session_id), " ", el("span", { class: "tag" }, s.status),
      el("span", { class: "tag" }, "finish: " + (s.finish_reason || "–")),
      t ? el("span", { class: "tag" }, "trajectory " + t.index) : el("span", { class: "tag drop" }, "left out of the group")),
    s.error ? el("p", { class: "err" }, s.error) : null,
    calls.length ? table(["call", "kind", "prompt ids", "completion ids", "finish reason", "latency", "attempts", "error"], calls, [0, 2, 3, 5, 6])
      : el("p", { class: "muted" }, "no calls"),
    t ? trainedTokens(t) : null);
}

async function agentSessions(g) {
  const bySession = new Map(g.trajectories.filter((t) => (t.metadata || {}).session_id).map((t) => [t.metadata.session_id, t]));
  const ids = [...bySession.keys(), ...((g.metadata || {}).left_out_sessions || [])];
  if (!ids.length) return;
  // one session that cannot be read (e.g. removed) says so in its place; the others still show
  const read = (id) => api("/v1/sessions/" + encodeURIComponent(id)).catch((e) => {
    if (e instanceof NeedKey) throw e;
    return { session_id: id, failed: String(e.message || e) };
  });
  const sessions = await Promise.all(ids.map(read));
  main.append(el("h2", { id: "agent-sessions" }, `Agent sessions (${sessions.length})`),
    ...sessions.map((s) => s.failed ? el("div", { class: "traj session", "data-session": s.session_id },
      el("h3", {}, "Session ", el("code", {}, s.session_id)), el("p", { class: "err" }, s.failed))
      : sessionView(s, bySession.get(s.session_id))));
}

async function trainer() {
  const [history, summary] = await Promise.all([api("/v1/policy/history?limit=1000"), api("/v1/summary")]);
  const rows = history.versions.map((v) => ({ x: v.version, m: v.metrics || {}, t: Date.parse(v.created_at) }));
  const g = summary.groups || {};
  // rates over the last 10 minutes, divided by at least one minute: a burst of versions published within
  // a second reads as that many per minute, not thousands (the span between its first and last was ~0)
  const now = Date.now(), recent = rows.filter((r) => now - r.t <= 600000);
  const span = recent.length ? Math.max(1, (now - Math.min(...recent.map((r) => r.t))) / 60000) : null;
  const consumed = recent.reduce((a, r) => a + (r.m.groups || 0), 0);
  main.append(el("h2", {}, "Trainer"), el("div", { class: "cards" }, card("policy version", summary.policy_version),
    card("active leases", summary.active_leases), card("ready groups", g.ready || 0), card("consumed groups", g.consumed || 0),
    card("versions per minute (last 10 min)", span ? fmt(recent.length / span) : "–"),
    card("groups trained per minute (last 10 min)", span && consumed ? fmt(consumed / span) : "–")));
  const m = (k) => rows.map((r) => [r.x, r.m[k] ?? null]);
  const clip = rows.map((r) => [r.x, r.m.clip_fraction ?? (r.m.clip_frac_low !== undefined ? (r.m.clip_frac_low || 0) + (r.m.clip_frac_high || 0) : null)]);
  const grid = el("div", { class: "grid" });
  main.append(grid);
  const base = { xLabel: "policy version" };
  lineChart(grid, { ...base, title: "Loss", yLabel: "loss", series: [{ name: "loss", points: m("loss") }] });
  lineChart(grid, { ...base, title: "KL", yLabel: "KL", series: [{ name: "KL to reference", points: rows.map((r) => [r.x, r.m.kl ?? r.m.kl_ref ?? null]) },
    { name: "approx KL to old policy", points: m("approx_kl") }] });
  lineChart(grid, { ...base, title: "Entropy", yLabel: "entropy", unit: "nats", series: [{ name: "entropy", points: m("entropy") }] });
  lineChart(grid, { ...base, title: "Clip fraction", unit: "%", yMin: 0, series: [{ name: "clipped tokens", points: clip }] });
  lineChart(grid, { ...base, title: "TIS weight (sampler / trainer mismatch)", yLabel: "weight", series: [{ name: "mean TIS weight", points: m("tis_weight") }] });
  lineChart(grid, { ...base, title: "Batch staleness", yLabel: "versions", yMin: 0, series: [{ name: "mean", points: m("staleness_mean") }, { name: "max", points: m("staleness_max") }] });
}

const PAGES = { overview, datasets, groups, trainer };

async function render() {
  const hash = location.hash.slice(1) || "overview";
  const [head] = hash.split("?");
  const [page, ...rest] = head.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === (page === "group" ? "groups" : page)));
  main.replaceChildren();
  const status = document.getElementById("status");
  try {
    if (page === "group" && arg) await group(arg);
    else if (page === "datasets" && arg) await dataset(arg);
    else await (PAGES[page] || overview)();
    status.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e instanceof NeedKey) { main.replaceChildren(keyForm(e.message)); document.getElementById("key-input").focus(); }
    else main.append(el("p", { class: "err", id: "error" }, String(e.message || e)));
    status.textContent = "";
  }
}

document.getElementById("key").onclick = () => {
  main.replaceChildren(keyForm(getKey() ? "The key this tab sends (kept until the tab closes):" : "No API key set."));
};
window.addEventListener("hashchange", render);
render();
