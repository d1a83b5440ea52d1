// Experiments: every experiment with its summary, and one experiment's pairs side by side (the original
// node and the candidate's answer, the answer's differences marked word by word). Text only, like every page.

import { enc, get } from "./api.js";
import { badge, fmtDuration, fmtInt, fmtScore, fmtTime, fmtUsd, h, jsonFold, put, shortId } from "./dom.js";
import { chat } from "./run.js";

function pct(rate) {
  return rate === null || rate === undefined ? "–" : `${Math.round(rate * 1000) / 10}%`;
}

function tokens(inp, out) {
  return `${fmtInt(inp || 0)} / ${fmtInt(out || 0)}`;
}

function ms(v) {
  return v === null || v === undefined ? "–" : fmtDuration(v);
}

export async function experimentsView(view) {
  const data = await get("experiments");
  const rows = data.experiments.map((e) => {
    const s = e.summary || {};
    return h("tr", { data: { name: e.name } },
      h("td", { class: "name" }, h("a", { href: `#/experiment/${enc(e.name)}` }, e.name)),
      h("td", {}, e.kind),
      h("td", {}, (e.models || []).join(", ")),
      h("td", { class: "num", data: { col: "runs" } }, e.kind === "program" ? `${fmtInt(s.runs)} runs`
        : [`${fmtInt(s.runs)} nodes`, h("span", { class: "muted" }, ` of ${fmtInt(e.originals)} run${e.originals === 1 ? "" : "s"}`)]),
      h("td", { class: `num ${s.errors ? "errors" : ""}`, data: { col: "errors" } }, fmtInt(s.errors)),
      h("td", { class: "num", data: { col: "changed" } }, `${fmtInt(s.answer_changed)}`,
        h("span", { class: "muted" }, ` (${fmtInt(s.answer_changed_normalised)} normalised)`)),
      h("td", { class: "num", data: { col: "tools" } }, pct(s.tool_agreement)),
      h("td", { class: "num" }, tokens(s.baseline_input_tokens, s.baseline_output_tokens), h("br"),
        h("span", { class: "cand" }, tokens(s.candidate_input_tokens, s.candidate_output_tokens))),
      h("td", { class: "num", data: { col: "cost" } }, fmtUsd(s.baseline_cost_usd), h("br"),
        h("span", { class: "cand" }, fmtUsd(s.candidate_cost_usd))),
      h("td", { class: "num" }, ms(s.baseline_latency_ms), h("br"), h("span", { class: "cand" }, ms(s.candidate_latency_ms))),
      h("td", { class: "muted" }, fmtTime(e.last_ns)));
  });
  put(view,
    h("div", { class: "bar" }, h("h1", {}, "Experiments"),
      h("span", { class: "muted" }, `${data.experiments.length} experiment${data.experiments.length === 1 ? "" : "s"}`)),
    h("table", { class: "runs experiments", id: "experiments" },
      h("thead", {}, h("tr", {}, ["experiment", "kind", "candidate", "answers", "errors", "answer changed",
        "tool agreement", "tokens in / out", "cost", "latency (mean)", "last run"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { class: "empty muted", colspan: 11 },
        "No experiments in this store (agenttape experiment run NAME --model M)")))),
    h("p", { class: "muted legend" }, "Tokens, cost and latency: the original on top, ",
      h("span", { class: "cand" }, "the candidate"), " below; cost unknown when a model has no price."));
}

// Words, each with the spaces after it (so shared spaces alone never split a change in pieces); the
// longest common subsequence keeps what both answers share.
function words(text) {
  return String(text || "").match(/^\s+|\S+\s*/g) || [];
}

export function wordDiff(a, b) {
  const x = words(a), y = words(b);
  if (x.length * y.length > 400000) {  // too long to align: the whole text marked when it differs
    const same = a === b;
    return { a: [{ t: String(a || ""), op: same ? "=" : "-" }], b: [{ t: String(b || ""), op: same ? "=" : "+" }] };
  }
  const n = x.length, m = y.length;
  const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    }
  }
  const outA = [], outB = [];
  const push = (arr, t, op) => {
    const last = arr[arr.length - 1];
    if (last && last.op === op) last.t += t; else arr.push({ t, op });
  };
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (x[i] === y[j]) { push(outA, x[i], "="); push(outB, y[j], "="); i++; j++; }
    else if (L[i + 1][j] >= L[i][j + 1]) { push(outA, x[i], "-"); i++; }
    else { push(outB, y[j], "+"); j++; }
  }
  for (; i < n; i++) push(outA, x[i], "-");
  for (; j < m; j++) push(outB, y[j], "+");
  return { a: outA, b: outB };
}

function marked(parts) {
  return h("pre", { class: "answer" }, parts.map((p) => p.op === "=" ? p.t
    : h(p.op === "-" ? "del" : "ins", { class: p.op === "-" ? "d-del" : "d-ins" }, p.t)));
}

function scoreList(evals, stored) {
  const items = [];
  for (const [name, v] of Object.entries(evals || {})) {
    if (v !== null && v !== undefined) items.push(h("span", { class: "score", data: { score: name } }, fmtScore(name, { value: v })));
  }
  for (const [name, sc] of Object.entries(stored || {})) {
    items.push(h("span", { class: "score", data: { score: name } }, fmtScore(name, sc)));
  }
  return items.length ? h("div", { class: "scores" }, items) : null;
}

const callKey = (c) => JSON.stringify([c.name, c.arguments]);

// ``other``: the other side's tool calls; a call it does not hold is marked as a difference
function sideView(label, side, parts, ref, evals, stored, error, other) {
  const calls = side.tool_calls || [];
  const theirs = new Set((other || []).map(callKey));
  return h("div", { class: "side" },
    h("div", { class: "node-head" }, h("strong", {}, label), " ",
      ref && ref.includes("@") ? h("a", { href: `#/run/${enc(ref)}`, class: "mono" }, shortId(ref, 16)) : null,
      h("span", { class: "muted" }, ` ${side.model || ""}`)),
    h("div", { class: "side-facts muted" },
      h("span", { data: { fact: "tokens" } }, `tokens ${tokens(side.input_tokens, side.output_tokens)}`), " · ",
      h("span", { data: { fact: "cost" } }, fmtUsd(side.cost_usd)), " · ",
      h("span", { data: { fact: "latency" } }, ms(side.latency_ms))),
    scoreList(evals, stored),
    error ? h("p", { class: "error" }, error) : marked(parts),
    calls.length ? h("div", { class: "calls" }, calls.map((c) => {
      const fold = jsonFold(c.arguments, `→ ${c.name}`, true);
      if (!error && other && !theirs.has(callKey(c))) fold.classList.add("call-diff");
      return fold;
    })) : null,
    (side.input || []).length ? h("details", { class: "prompt" },
      h("summary", {}, `prompt (${side.input.length} message${side.input.length === 1 ? "" : "s"})`), chat(side.input)) : null);
}

function verdict(p) {
  if (p.error) return h("span", { class: "badge st-error" }, "error");
  if (p.same_exact) return h("span", { class: "badge st-completed" }, "same");
  if (p.same_normalised) return h("span", { class: "badge st-incomplete" }, "same when normalised");
  return h("span", { class: "badge st-changed" }, "changed");
}

function pairView(p, i, evals) {
  // a failed call has no answer to compare: the original is shown as it is
  const d = p.error ? { a: [{ t: String(p.baseline.answer || ""), op: "=" }], b: [] } : wordDiff(p.baseline.answer, p.candidate.answer);
  const base = {}, cand = {};
  for (const [name, v] of Object.entries(p.scores || {})) { base[name] = v.baseline; cand[name] = v.candidate; }
  const state = p.error ? "error" : p.same_exact ? "same" : "changed";
  return h("section", { class: `pair is-${state}`, data: { of: p.of, node: p.node, state } },
    h("div", { class: "pair-head" }, h("strong", {}, `#${i + 1}`), " ", verdict(p), " ",
      p.tools_agree === false ? h("span", { class: "badge st-error", data: { tools: "disagree" } }, "tool calls differ") : null,
      h("span", { class: "muted" }, " original run "),
      p.of.includes("@") ? h("a", { href: `#/run/${enc(p.of)}` }, shortId(p.of, 20)) : h("code", {}, shortId(p.of, 20)),
      p.node ? h("span", { class: "muted mono" }, ` node ${p.node}`) : h("span", { class: "muted" }, " whole run")),
    h("div", { class: "sides" },
      sideView(evals.baseline === "original" ? "original" : `baseline ${evals.baseline}`, p.baseline, d.a,
        p.baseline_ref || p.of, base, p.baseline_scores || p.original_scores, null, p.error ? null : p.candidate.tool_calls),
      sideView("candidate", p.candidate, d.b, p.candidate_ref, cand, p.candidate_scores, p.error, p.baseline.tool_calls)));
}

export async function experimentView(view, name, params) {
  const query = { baseline: params.get("baseline") || undefined };
  const data = await get(`experiments/${enc(name)}`, query);
  const s = data.summary;
  const e = data.experiment || {};
  const only = params.get("only") || "";
  const shown = data.runs.filter((p) => !only || (only === "changed" ? p.same_exact === false : only === "errors" ? p.error : true));
  const filterLink = (value, label) => h("a", { href: `#/experiment/${enc(name)}${value ? `?only=${value}` : ""}`,
    class: only === value ? "active" : "" }, label);
  put(view,
    h("div", { class: "bar" }, h("h1", {}, "Experiment ", h("code", { id: "experiment-name" }, name)),
      h("span", { class: "muted" }, `${e.kind || ""} · ${(e.models || []).join(", ")} · against ${data.baseline}`),
      h("a", { href: "#/experiments" }, "All experiments")),
    h("dl", { class: "facts", id: "experiment-summary" },
      h("dt", {}, "answers"), h("dd", { data: { fact: "runs" } }, `${fmtInt(s.runs)} ${e.kind === "program" ? "runs" : "nodes"}` +
        ` of ${fmtInt(e.originals)} original run${e.originals === 1 ? "" : "s"}, ${fmtInt(s.errors)} failed`),
      h("dt", {}, "answer changed"), h("dd", { data: { fact: "changed" } },
        `${fmtInt(s.answer_changed)} exactly, ${fmtInt(s.answer_changed_normalised)} after normalising`),
      h("dt", {}, "tool agreement"), h("dd", { data: { fact: "tools" } }, pct(s.tool_agreement)),
      h("dt", {}, "tokens in / out"), h("dd", {}, `${tokens(s.baseline_input_tokens, s.baseline_output_tokens)} → ` +
        tokens(s.candidate_input_tokens, s.candidate_output_tokens)),
      h("dt", {}, "cost"), h("dd", { data: { fact: "cost" } }, `${fmtUsd(s.baseline_cost_usd)} → ${fmtUsd(s.candidate_cost_usd)}`),
      h("dt", {}, "latency (mean)"), h("dd", {}, `${ms(s.baseline_latency_ms)} → ${ms(s.candidate_latency_ms)}`)),
    h("nav", { class: "tabs" }, filterLink("", `all (${data.runs.length})`),
      filterLink("changed", `changed (${s.answer_changed})`), filterLink("errors", `errors (${s.errors})`)),
    h("div", { class: "pairs", id: "pairs" }, shown.length ? shown.map((p, i) => pairView(p, i, { baseline: data.baseline }))
      : h("p", { class: "muted" }, "Nothing to show here.")));
}
