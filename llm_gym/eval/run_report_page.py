"""The run report's page: HTML, style and script in one string (no CDN, no server).

:func:`llm_gym.eval.run_report.render_run_report` puts the escaped title at ``__TITLE__`` and the
run's JSON at ``__DATA__``. The script draws the curves as SVG and builds every element from the
data with ``textContent``, so no text of a run is read as markup.
"""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:12px 20px;
color:#222;background:#fafafa}
h1{font-size:22px;margin:6px 0}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right}th:first-child,td:first-child{text-align:left}th{background:#f0f0f0}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{background:#fff;border:1px solid #ddd;
padding:6px}.chart h3{font-size:13px;margin:0 0 4px}.legend span{margin-right:10px;
font-size:12px}.swatch{display:inline-block;width:10px;height:10px;margin-right:3px}
.health{background:#fff4e5;border-left:4px solid #e67e22;padding:6px 10px;margin:6px 0}
.ok{color:#2e7d32}.bad{color:#c62828}pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;
padding:4px 6px;font:12px/1.4 ui-monospace,monospace}.trained{background:#e3f2fd;
border-left:3px solid #1565c0}.context{background:#f3f3f3;border-left:3px solid #999}
.episode{background:#fff;border:1px solid #ddd;margin:4px 0;padding:4px 8px}
.turn{margin:6px 0 6px 8px}.meta{color:#666;font-size:12px}.m1{background:#bbdefb}
.m0{color:#777}.filters label{margin-right:12px}select{margin-left:4px}
</style></head><body>
<h1 id="title"></h1><p class="meta" id="subtitle"></p><p id="kept"></p>
<div id="notes"></div>
<h2>Health checks</h2><div id="health"></div>
<h2>Curves</h2><div class="charts" id="charts"></div>
<h2>Evaluations</h2><div id="evaluations"></div>
<h2>Episodes</h2>
<p class="meta"><span class="trained">&nbsp;sampled by the policy (trained, env_mask 1)&nbsp;</span>
<span class="context">&nbsp;context from the environment (env_mask 0)&nbsp;</span></p>
<div class="filters" id="filters"></div><p id="count"></p><div id="episodes"></div>
<h2>Config</h2><details><summary>the run's config and summary</summary>
<pre id="config"></pre></details>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}
const fmt = (v, d = 3) => (v === null || v === undefined ? "-" :
  typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(d)) : String(v));
const COLORS = ["#1565c0", "#2e7d32", "#c62828", "#6a1b9a", "#ef6c00", "#00838f", "#795548"];
const CHARTS = [
  ["Reward and success", [["reward", "train reward"], ["episodes/success_rate", "train success"],
    ["val/success_rate", "validation success"]]],
  ["Tool use", [["episodes/tool_calls_mean", "tool calls per episode"],
    ["episodes/turns_mean", "turns per episode"]]],
  ["Lengths", [["episodes/completion_tokens_mean", "sampled tokens per episode"]]],
  ["Truncation causes", [["truncated_ratio", "truncated"], ["context_overflow_ratio",
    "context overflow"], ["parse_failure_ratio", "parse failure"], ["episodes/max_turns_ratio",
    "max turns"], ["episodes/env_truncated_ratio", "env"], ["episodes/capped_turn_ratio",
    "turns at the token cap"]]],
  ["Entropy and signal", [["entropy", "entropy (nats per token)"],
    ["zero_variance_skip_ratio", "zero-variance groups"]]],
  ["Optimisation", [["loss", "loss"], ["grad_norm", "grad norm"]]],
];
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}
function chart(title, lines, marks) {
  const series = lines.map(([key, label]) => [label, D.steps.filter((r) =>
    typeof r[key] === "number" && typeof r.step === "number").map((r) => [r.step, r[key]])])
    .filter(([, pts]) => pts.length);
  if (!series.length) return null;
  const W = 360, H = 190, L = 44, R = 8, T = 14, B = 24;
  const xs = series.flatMap(([, p]) => p.map((q) => q[0]));
  const ys = series.flatMap(([, p]) => p.map((q) => q[1]));
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const s = svg("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`});
  s.append(svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999"}));
  s.append(svg("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#999"}));
  const label = (x, y, text, anchor) => { const t = svg("text", {x, y, "font-size": 10,
    "text-anchor": anchor, fill: "#555"}); t.textContent = text; s.append(t); };
  label(L - 3, T + 4, fmt(y1), "end"); label(L - 3, H - B, fmt(y0), "end");
  label(L, H - 8, fmt(x0, 0), "start"); label(W - R, H - 8, fmt(x1, 0), "end");
  label((L + W) / 2, H - 8, "step", "middle");
  for (const m of marks) {
    if (m.step < x0 || m.step > x1) continue;
    const line = svg("line", {x1: X(m.step), x2: X(m.step), y1: T, y2: H - B,
      stroke: "#e67e22", "stroke-dasharray": "4 3", class: "health-mark"});
    const tip = svg("title", {}); tip.textContent = `health: ${m.check} at step ${m.step}`;
    line.append(tip); s.append(line);
    const right = X(m.step) > (L + W) / 2;  // the name on the side with room
    label(X(m.step) + (right ? -3 : 3), T + 8, m.check, right ? "end" : "start");
  }
  series.forEach(([, pts], i) => {
    const c = COLORS[i % COLORS.length];
    if (pts.length > 1) s.append(svg("polyline", {fill: "none", stroke: c, "stroke-width": 1.6,
      points: pts.map(([x, y]) => `${X(x)},${Y(y)}`).join(" ")}));
    for (const [x, y] of pts.length <= 40 ? pts : []) s.append(svg("circle",
      {cx: X(x), cy: Y(y), r: 2.2, fill: c}));
  });
  const legend = el("div", {class: "legend"}, ...series.map(([name], i) => el("span", {},
    el("span", {class: "swatch", style: `background:${COLORS[i % COLORS.length]}`}), name)));
  return el("div", {class: "chart"}, el("h3", {}, title), s, legend);
}
function header() {
  const s = D.summary || {}, c = D.config || {};
  $("title").textContent = `Run report: ${D.title}`;
  const parts = [s.env || c.env, c.model && `model ${c.model}`, s.grpo_tasks &&
    `${s.grpo_tasks} GRPO tasks`, typeof s.total_seconds === "number" &&
    `${(s.total_seconds / 60).toFixed(1)} min`, `generated ${D.generated}`];
  $("subtitle").textContent = parts.filter(Boolean).join(" · ");
  const b = s.best_point;  // grpo.keep_best: the validation point the model holds
  if (b) $("kept").textContent = `Model after GRPO: the weights of step ${b.step}, its best ` +
    `validation point (${b.metric} ${fmt(b.value)}; the last step, ${b.final_step}, had ` +
    `${fmt(b.final_value)}).`;
  for (const n of D.notes) $("notes").append(el("p", {class: "meta"}, `note: ${n}`));
  $("config").textContent = JSON.stringify({config: D.config, summary: D.summary}, null, 2);
}
function health() {
  if (!D.health.length) {
    $("health").append(el("p", {class: "ok"}, D.steps.length ?
      "No health check fired." : "No step log: nothing was checked."));
    return;
  }
  for (const h of D.health) {
    const text = `${h.check} fired at step ${h.step}` + (h.detail ? `: ${h.detail}.` : ".");
    const box = el("div", {class: "health"}, el("b", {}, text));
    if (h.cause) box.append(el("div", {}, `Likely cause: ${h.cause}.`));
    if (h.remedy) box.append(el("div", {}, `Try: ${h.remedy}.`));
    $("health").append(box);
  }
}
function evaluations() {
  const labels = Object.keys(D.evaluations);
  if (!labels.length) {
    $("evaluations").append(el("p", {}, "No evaluation in this run."));
    return;
  }
  const t = el("table", {}, el("tr", {}, ...["evaluation", "episodes", "success", "95% interval",
    "mean reward", "turns", "tool calls", "truncated"].map((h) => el("th", {}, h))));
  for (const label of labels) {
    const m = D.evaluations[label].metrics || {};
    t.append(el("tr", {}, ...[label, fmt(m.episodes, 0), fmt(m.success_rate),
      `[${fmt(m.success_ci_low)}, ${fmt(m.success_ci_high)}]`, fmt(m.reward_mean),
      fmt(m.turns_mean, 2), fmt(m.tool_calls_mean, 2), fmt(m.truncated_ratio)]
      .map((v) => el("td", {}, v))));
  }
  $("evaluations").append(t);
  const ev = (D.summary || {}).evaluation;
  if (!ev) return;
  const g = el("table", {}, el("tr", {}, ...["held-out success (paired by task)", "tasks",
    "before", "after", "gain", "95% interval"].map((h) => el("th", {}, h))));
  const rows = [["", ev], ...Object.entries(ev.variants || {})];
  for (const [name, v] of rows) for (const mode of ["greedy", "sampled"]) {
    const r = v[mode]; if (!r) continue;
    const ci = r.gain_ci || [null, null];
    g.append(el("tr", {}, ...[`${ev.split || ""} ${name} ${mode}`.trim(), fmt(r.tasks, 0),
      fmt(r.success_before), fmt(r.success_after), fmt(r.gain),
      `[${fmt(ci[0])}, ${fmt(ci[1])}]`].map((x) => el("td", {}, x))));
  }
  $("evaluations").append(g);
}
const FILTERS = [["eval", "evaluation"], ["kind", "task kind"], ["outcome", "outcome"],
  ["ended", "ended"]];
function values(key) {
  const labels = Object.keys(D.episodes);
  if (key === "eval") return labels;
  const all = labels.flatMap((l) => D.episodes[l].shown);
  const of = (e) => key === "outcome" ? (e.success ? "success" : "failure") : e[key];
  return [...new Set(all.map(of).filter((v) => v !== null && v !== undefined))].sort();
}
function filters() {
  const wanted = new URLSearchParams(location.hash.slice(1));
  for (const [key, name] of FILTERS) {
    const s = el("select", {id: `f-${key}`});
    if (key !== "eval") s.append(el("option", {value: ""}, "all"));
    for (const v of values(key)) s.append(el("option", {value: v}, v));
    if (wanted.has(key)) s.value = wanted.get(key);
    if (s.selectedIndex < 0 && s.options.length) s.selectedIndex = 0;  // a value it lacks
    s.addEventListener("change", episodes);
    $("filters").append(el("label", {}, name, s));
  }
}
function episodeView(e, i) {
  const outcome = e.success ? "success" : "failure";
  const d = el("details", {class: "episode", "data-outcome": outcome});
  d.append(el("summary", {}, `#${i + 1} ${e.kind || "task"} · `, el("span",
    {class: e.success ? "ok" : "bad"}, outcome), ` · ended: ${e.ended} · reward ${fmt(e.reward)}` +
    ` · ${e.turns.length} turn(s)` + (e.target !== null ? ` · target ${e.target}` : "")));
  const prompt = el("details", {}, el("summary", {class: "meta"},
    `prompt (${e.prompt.length} message(s))`));
  for (const m of e.prompt) prompt.append(el("pre", {class: "context"}, `${m.role}: ${m.content}`));
  d.append(prompt);
  e.turns.forEach((t, k) => {
    const turn = el("div", {class: "turn"}, el("div", {class: "meta"}, `turn ${k + 1} · ` +
      `${t.parse}` + (t.tool_calls ? ` · ${t.tool_calls} tool call(s)` : "") +
      (t.finish_reason === "length" ? " · stopped at the token cap" : "") +
      (t.reward !== null ? ` · turn reward ${fmt(t.reward)}` : "")),
      el("pre", {class: "trained"}, t.text));
    for (const m of t.env) turn.append(el("pre", {class: "context"}, `${m.role}: ${m.content}`));
    d.append(turn);
  });
  e.samples.forEach((spans, k) => {
    const pre = el("pre", {});
    for (const [text, mask] of spans) pre.append(el("span", {class: `m${mask}`}, text));
    d.append(el("details", {}, el("summary", {class: "meta"},
      `training sample ${k + 1}: tokens by env_mask`), pre));
  });
  return d;
}
function episodes() {
  const pick = Object.fromEntries(FILTERS.map(([k]) => [k, $(`f-${k}`).value]));
  try {
    history.replaceState(null, "", "#" + new URLSearchParams(Object.entries(pick)
      .filter(([, v]) => v)).toString());
  } catch (err) { /* a page opened where the address cannot change: filters still apply */ }
  const box = $("episodes"); box.replaceChildren();
  const file = D.episodes[pick.eval];
  if (!file) { $("count").textContent = "No episodes in this run."; return; }
  const shown = file.shown.filter((e) => (!pick.kind || e.kind === pick.kind) &&
    (!pick.outcome || (e.success ? "success" : "failure") === pick.outcome) &&
    (!pick.ended || e.ended === pick.ended));
  shown.forEach((e) => box.append(episodeView(e, file.shown.indexOf(e))));
  $("count").textContent = `${shown.length} of ${file.shown.length} episodes shown` +
    (file.total > file.shown.length ? ` (the file holds ${file.total}; the first ` +
      `${file.shown.length} are in this page)` : "");
}
header(); health();
const marks = D.health.filter((h) => typeof h.step === "number");
for (const [title, lines] of CHARTS) {
  const c = chart(title, lines, marks); if (c) $("charts").append(c);
}
if (!$("charts").children.length) $("charts").append(el("p", {}, "No step log in this run."));
evaluations(); filters(); episodes();
</script></body></html>
"""
