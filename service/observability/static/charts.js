"use strict";
// A small SVG line chart: axes with ticks and labels, units, a legend, and gaps where data is missing
// (a null value, or a jump of more than `maxStep` on the x axis, breaks the line).
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f7dd1", "#2e9d5b", "#c8423b", "#c98a12", "#7a4fc9", "#1b9aa8", "#d4578f", "#5b6672"];

  function svg(tag, attrs, text) {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  }

  const finite = (v) => typeof v === "number" && Number.isFinite(v);

  // lo/hi must be finite and moderate (|v| < 1e100; `scaler` brings any finite values there)
  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) { const pad = Math.abs(lo) > 0 ? Math.abs(lo) * 0.1 : 1; lo -= pad; hi += pad; }
    const raw = (hi - lo) / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    if (!finite(step) || !(step > 0)) return { lo, hi, ticks: [lo, hi] };
    const start = Math.floor(lo / step) * step, end = Math.ceil(hi / step) * step;
    const ticks = [];
    for (let v = start; v <= end + step / 2 && ticks.length < 50; v += step) ticks.push(Number(v.toPrecision(12)));
    return { lo: start, hi: end, ticks };
  }

  // Values of any finite size are charted as v / 10^e (so ranges and ticks never overflow or underflow);
  // e = 0 for ordinary values. The tick labels carry the exponent.
  function scaler(values) {
    const maxAbs = Math.max(0, ...values.map(Math.abs));
    const e = maxAbs > 0 && (maxAbs >= 1e100 || maxAbs < 1e-100) ? Math.floor(Math.log10(maxAbs)) : 0;
    const a = Math.trunc(-e / 2), b = -e - a;  // 10^-e in two factors: 10^±324 alone is 0 or Infinity
    const scale = (v) => (e === 0 ? v : v * Math.pow(10, a) * Math.pow(10, b));
    const label = (t, unit) => (e === 0 ? fmt(t, unit) : `${Number(t.toPrecision(6))}e${e}`);
    return { scale, label, e };
  }

  // Labels for a row of ticks: as few decimals as keep every label distinct and true to its tick
  // (fmt's two significant digits printed 0.00675, 0.0068, 0.00685 all as "0.0068")
  function tickLabels(ticks, unit) {
    const vs = ticks.map((t) => (unit === "%" ? t * 100 : t));
    const step = vs.length > 1 ? Math.abs(vs[1] - vs[0]) : 0;
    for (let d = 0; d <= 12; d++) {
      const labels = vs.map((v) => (Math.abs(v) >= 1e6 || (v !== 0 && Math.abs(v) < 1e-6) ? v.toExponential(Math.min(d, 6)) : v.toFixed(d)));
      const exact = vs.every((v, i) => Math.abs(Number(labels[i]) - v) <= (step || Math.abs(v) || 1) * 1e-6);
      if (new Set(labels).size === labels.length && exact) return labels.map((l) => (unit === "%" ? l + "%" : l));
    }
    return ticks.map((t) => fmt(t, unit));
  }

  function fmt(v, unit) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (unit === "%") return (v * 100).toFixed(Math.abs(v) < 0.1 ? 1 : 0) + "%";
    const a = Math.abs(v);
    const s = a >= 1e4 ? v.toExponential(1) : a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toPrecision(2);
    return unit ? s + " " + unit : s;
  }

  // opts: {title, xLabel, yLabel, unit ("%" scales fractions), series: [{name, points: [[x, y|null]]}],
  //        yMin, yMax, maxStep (largest x step drawn as a line; default 1, i.e. consecutive versions)}
  function lineChart(container, opts) {
    const W = 520, H = 270, L = 70, R = 14, T = 46, B = 46;
    const box = document.createElement("div");
    box.className = "chart";
    container.append(box);
    const series = (opts.series || []).filter((s) => s.points.some((p) => finite(p[0]) && finite(p[1])));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opts.title });
    root.append(svg("text", { x: L, y: 18, "font-size": 14, "font-weight": 600, class: "chart-title" }, opts.title));
    box.append(root);
    if (!series.length) {
      root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#7b8794", "font-size": 13 }, "no data yet"));
      return box;
    }
    const xs = series.flatMap((s) => s.points.map((p) => p[0])).filter(finite);
    const rawYs = series.flatMap((s) => s.points.map((p) => p[1])).filter(finite);
    const ys = rawYs.concat([opts.yMin, opts.yMax].filter(finite));
    const xs_ = scaler(xs), ys_ = scaler(ys);
    const xr = niceTicks(Math.min(...xs.map(xs_.scale)), Math.max(...xs.map(xs_.scale)), 6);
    const yr = niceTicks(Math.min(...ys.map(ys_.scale)), Math.max(...ys.map(ys_.scale)), 5);
    const px = (x) => L + ((xs_.scale(x) - xr.lo) / (xr.hi - xr.lo)) * (W - L - R);
    const py = (y) => H - B - ((ys_.scale(y) - yr.lo) / (yr.hi - yr.lo)) * (H - T - B);
    const axes = svg("g", { class: "axes", "font-size": 11, fill: "#5b6672" });
    const tyy = (t) => H - B - ((t - yr.lo) / (yr.hi - yr.lo)) * (H - T - B);  // ticks are in scaled units
    const txx = (t) => L + ((t - xr.lo) / (xr.hi - xr.lo)) * (W - L - R);
    const yLabels = ys_.e === 0 ? tickLabels(yr.ticks, opts.unit === "%" ? "%" : "") : yr.ticks.map((t) => ys_.label(t, ""));
    yr.ticks.forEach((t, i) => {
      axes.append(svg("line", { x1: L, x2: W - R, y1: tyy(t), y2: tyy(t), stroke: "#eceff3" }));
      axes.append(svg("text", { x: L - 6, y: tyy(t) + 4, "text-anchor": "end", class: "tick y-tick" }, yLabels[i]));
    });
    const integerX = xs.every((x) => Number.isInteger(x));
    for (const t of xr.ticks) {
      if (integerX && !Number.isInteger(t)) continue;
      axes.append(svg("line", { x1: txx(t), x2: txx(t), y1: H - B, y2: H - B + 4, stroke: "#5b6672" }));
      axes.append(svg("text", { x: txx(t), y: H - B + 16, "text-anchor": "middle", class: "tick x-tick" }, xs_.e === 0 ? String(t) : xs_.label(t, "")));
    }
    axes.append(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#5b6672", class: "x-axis" }));
    axes.append(svg("line", { x1: L, x2: L, y1: T, y2: H - B, stroke: "#5b6672", class: "y-axis" }));
    axes.append(svg("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle", class: "x-label" }, opts.xLabel || ""));
    const yl = (opts.yLabel || "") + (opts.unit && opts.unit !== "%" ? ` (${opts.unit})` : opts.unit === "%" ? " (%)" : "");
    axes.append(svg("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(T + H - B) / 2})`, class: "y-label" }, yl));
    root.append(axes);
    const maxStep = opts.maxStep === undefined ? 1 : opts.maxStep;
    series.forEach((s, i) => {
      const color = s.color || COLORS[i % COLORS.length];
      let d = "", prev = null;
      const pts = [...s.points].sort((a, b) => a[0] - b[0]);
      for (const [x, y] of pts) {
        const ok = finite(x) && finite(y);
        if (!ok) { prev = null; continue; }
        const join = prev !== null && (maxStep === null || x - prev <= maxStep);
        d += `${join ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`;
        prev = x;
        const dot = svg("circle", { cx: px(x), cy: py(y), r: 2.2, fill: color });
        dot.append(svg("title", {}, `${s.name}: ${fmt(y, opts.unit)} at ${opts.xLabel || "x"} ${x}`));
        root.append(dot);
      }
      root.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.6, class: "series" }));
      const lx = L + (i % 3) * 150, ly = 34 + Math.floor(i / 3) * 12;
      root.append(svg("rect", { x: lx, y: ly - 8, width: 10, height: 3, fill: color }));
      root.append(svg("text", { x: lx + 14, y: ly - 4, "font-size": 11, fill: "#1d232a", class: "legend" }, s.name));
    });
    return box;
  }

  window.Charts = { lineChart, fmt, niceTicks, tickLabels };
})();
