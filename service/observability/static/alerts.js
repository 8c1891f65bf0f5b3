"use strict";
// The alerts panel above every dashboard page: open training-health alerts (state, since when, value vs
// threshold) with the series that tripped each one, then the latest resolved ones (docs/alerts.md).
(() => {
  const KEY = "grpo-curator-api-key";
  const { lineChart, fmt } = window.Charts;
  const REFRESH_MS = 30000;

  function el(tag, attrs = {}, ...kids) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) if (k === "class") n.className = v; else n.setAttribute(k, v);
    for (const k of kids.flat()) if (k !== null && k !== undefined) n.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return n;
  }

  async function alerts() {
    const key = localStorage.getItem(KEY);
    const r = await fetch("/v1/alerts?limit=50", { headers: key ? { Authorization: "Bearer " + key } : {} });
    if (!r.ok) return null;  // no key yet (the page asks for one) or not allowed: no panel
    return (await r.json()).alerts;
  }

  function evidenceChart(grid, a) {
    const ev = a.evidence || {};
    const versions = ev.versions || [];
    const series = Object.entries(ev).filter(([k, v]) => k !== "versions" && Array.isArray(v))  // numbers beside the series (entropy_level) are not drawn
      .map(([name, values]) => ({ name, points: versions.map((v, i) => [v, values[i] ?? null]) }));
    lineChart(grid, { title: `${a.monitor} (${a.dataset ?? "overall"})`, xLabel: "policy version", series });
  }

  function row(a) {
    return el("tr", { class: "alert-row" },
      el("td", {}, el("span", { class: "tag " + a.state }, a.state)), el("td", {}, a.monitor),
      el("td", {}, a.dataset ?? "overall"), el("td", {}, new Date(a.since).toLocaleString()),
      el("td", { class: "num" }, fmt(a.value)), el("td", { class: "num" }, fmt(a.threshold)));
  }

  async function render() {
    let panel = document.getElementById("alerts");
    const list = await alerts().catch(() => null);
    if (list === null) return;
    if (!panel) {
      panel = el("section", { id: "alerts" });
      document.getElementById("main").before(panel);
    }
    const open = list.filter((a) => a.state !== "resolved");
    const recent = list.filter((a) => a.state === "resolved").slice(0, 5);
    const head = el("tr", {}, ["state", "monitor", "dataset", "since", "value", "threshold"].map((h) => el("th", {}, h)));
    const kids = [el("h2", {}, `Alerts: ${open.length} open`)];
    if (open.length || recent.length) kids.push(el("table", {}, head, [...open, ...recent].map(row)));
    else kids.push(el("p", { class: "muted" }, "no alerts: every monitor is ok"));
    const grid = el("div", { class: "grid alert-charts" });
    if (open.length) kids.push(grid);
    panel.replaceChildren(...kids);
    open.forEach((a) => evidenceChart(grid, a));
  }

  window.addEventListener("hashchange", render);
  setInterval(render, REFRESH_MS);
  render();
})();
