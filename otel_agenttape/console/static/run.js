// One run: header with totals, then its ordered steps, its nodes' full input and output, a waterfall of
// its spans, and the replay JSON.

import { download, enc, get, verification } from "./api.js";
import { badge, clear, costTitle, fmtCost, fmtDuration, fmtInt, fmtTime, fmtUsd, h, jsonFold, longText, plural, put, shortId, valueView } from "./dom.js";
import { verifyBadge } from "./runs.js";

function message(m) {
  const role = m.role || "message";
  return h("div", { class: `msg role-${role.replace(/[^a-z_]/gi, "")}` },
    h("div", { class: "role" }, role, m.tool_call_id ? h("span", { class: "muted" }, ` → ${m.tool_call_id}`) : null),
    m.content ? longText(m.content, "content") : null,
    (m.tool_calls || []).map((c) => h("div", { class: "tool-call" },
      h("span", { class: "tc-name" }, `${c.name || "tool"}(`), h("span", { class: "muted" }, c.id || ""), ")",
      valueView(c.arguments, "arguments"))));
}

export function chat(messages) {
  return h("div", { class: "chat" }, (messages || []).map(message));
}

// Consecutive text (or reasoning) steps of one span are one streamed segment.
function coalesce(steps) {
  const out = [];
  for (const st of steps) {
    const last = out[out.length - 1];
    if (last && (st.kind === "text" || st.kind === "reasoning") && last.kind === st.kind && last.span_id === st.span_id) {
      last.content = String(last.content || "") + String(st.content || "");
      last.parts += 1;
      continue;
    }
    out.push({ ...st, parts: 1 });
  }
  return out;
}

// A run whose own spans carry no input (or output) shows the one read from a model call, and says so.
function fromNote(from, what, call) {
  return from === "model_call" ? h("p", { class: "muted from-note", data: { from: what } },
    `The run's own span carries no ${what}: this is ${call}'s.`) : null;
}

function stepView(st, t0) {
  const offset = st.time_ns && t0 ? fmtDuration(Number(BigInt(st.time_ns) - BigInt(t0)) / 1e6) : "";
  let body = null;
  switch (st.kind) {
    case "input": body = h("div", {}, chat(st.content), fromNote(st.input_from, "input", "the first model call")); break;
    case "text": body = h("div", { class: "assistant" }, longText(st.content, "content")); break;
    case "reasoning": body = h("div", { class: "reasoning" }, longText(st.content, "content")); break;
    case "tool_call": body = valueView(st.content, "arguments"); break;
    case "tool_result": body = valueView(st.content, st.status === "error" ? "error" : "result"); break;
    case "terminal": body = h("div", {}, badge(st.status), st.content ? h("span", { class: "muted" }, ` ${st.content}`) : null,
      st.output ? h("div", { class: "assistant" }, longText(st.output, "content")) : null,
      fromNote(st.output_from, "output", "the last model call")); break;
    default: body = valueView(st.content, st.name || st.kind);
  }
  const title = [st.name, st.kind === "tool_call" || st.kind === "tool_result" ? st.call_id : null]
    .filter(Boolean).join(" · ");
  return h("li", { class: `step kind-${st.kind} ${st.status === "error" ? "is-error" : ""}`, data: { kind: st.kind } },
    h("div", { class: "step-head" },
      h("span", { class: "idx" }, `#${st.index}`),
      h("span", { class: "kind" }, st.kind.replace("_", " ")),
      title ? h("span", { class: "name" }, title) : null,
      st.status && st.kind !== "terminal" ? badge(st.status) : null,
      st.parts > 1 ? h("span", { class: "muted" }, `${st.parts} streamed segments`) : null,
      h("span", { class: "offset muted" }, offset ? `+${offset}` : "")),
    h("div", { class: "step-body" }, body));
}

function nodeView(n) {
  const head = h("div", { class: "node-head" },
    h("span", { class: `ntype t-${n.type}` }, n.type),
    h("strong", {}, n.type === "model" ? (n.model || n.name) : (n.tool || n.name)),
    badge(n.status),
    h("span", { class: "muted" }, fmtDuration(n.duration_ms)),
    n.usage && (n.usage.input_tokens || n.usage.output_tokens)
      ? h("span", { class: "muted" }, `tokens ${fmtInt(n.usage.input_tokens || 0)} / ${fmtInt(n.usage.output_tokens || 0)}`) : null,
    n.type === "model" && "cost_usd" in n
      ? h("span", { class: `muted node-cost${n.cost_usd === null ? " unpriced" : ""}`,
        title: n.cost_usd === null ? "no price for this model: cost unknown, not 0" : "" }, `cost ${fmtUsd(n.cost_usd)}`) : null,
    n.retry_count ? h("span", { class: "warn" }, `${n.retry_count} retr${n.retry_count === 1 ? "y" : "ies"}`) : null,
    (n.truncated || []).length ? h("span", { class: "warn" }, `truncated: ${n.truncated.join(", ")}`) : null);
  const body = [];
  if (n.type === "model") {
    body.push(h("h4", {}, "Input"), chat(n.input));
    if (n.reasoning) body.push(h("h4", {}, "Reasoning"), h("div", { class: "reasoning" }, longText(n.reasoning)));
    body.push(h("h4", {}, "Output"), n.output ? h("div", { class: "assistant" }, longText(n.output, "content"))
      : h("p", { class: "muted" }, "(no text)"));
    if ((n.tool_calls || []).length) {
      body.push(h("h4", {}, "Tool calls"), (n.tool_calls || []).map((c) => h("div", { class: "tool-call" },
        h("span", { class: "tc-name" }, c.name || "tool"), " ", h("span", { class: "muted" }, c.id || ""),
        valueView(c.arguments, "arguments"))));
    }
  } else if (n.type === "tool") {
    body.push(h("h4", {}, "Arguments"), valueView(n.arguments, "arguments"));
    if (n.error) body.push(h("h4", { class: "error" }, "Error"), longText(n.error, "content error"));
    // a failed tool usually has no result: its error says it all
    if (!n.error || (n.result !== null && n.result !== undefined && n.result !== "")) {
      body.push(h("h4", {}, "Result"), valueView(n.result, "result"));
    }
  }
  if (n.status_message && n.status_message !== n.error) body.push(h("p", { class: "error" }, n.status_message));
  body.push(jsonFold(n, "node JSON"));
  return h("section", { class: `node node-${n.type}`, data: { span: n.span_id } }, head, h("div", { class: "node-body" }, body));
}

function waterfall(tl) {
  const span = Math.max(1, tl.end_ns - tl.start_ns);
  const rows = tl.spans.map((s) => {
    const left = ((s.start_ns - tl.start_ns) / span) * 100;
    const width = Math.max(0.3, ((s.end_ns - s.start_ns) / span) * 100);
    const bar = h("div", { class: `bar op-${(s.operation || "other").replace(/[^a-z_]/gi, "")} ${s.status === "error" ? "is-error" : ""}`,
      title: `${s.name}: ${fmtDuration((s.end_ns - s.start_ns) / 1e6)}` });
    bar.style.left = `${left}%`;
    bar.style.width = `${Math.min(width, 100 - left)}%`;
    const label = h("div", { class: "wf-label", title: s.name }, s.name);
    label.style.paddingLeft = `${s.depth * 14 + 4}px`;
    return h("div", { class: "wf-row", data: { span: s.span_id } }, label,
      h("div", { class: "wf-track" }, bar), h("div", { class: "wf-dur muted" }, fmtDuration((s.end_ns - s.start_ns) / 1e6)));
  });
  return h("div", { class: "waterfall", id: "waterfall" },
    h("div", { class: "wf-row wf-axis" }, h("div", { class: "wf-label muted" }, `${tl.spans.length} spans`),
      h("div", { class: "wf-track muted" }, `0 — ${fmtDuration(span / 1e6)}`), h("div", { class: "wf-dur" }, "")),
    rows);
}

export async function runView(view, ref, params) {
  const [summary, steps] = await Promise.all([get(`runs/${enc(ref)}`), get(`runs/${enc(ref)}/steps`)]);
  const tab = params.get("tab") || "steps";
  const vcell = h("span", {}, verifyBadge(summary.tape_id, undefined));
  const dl = h("button", { type: "button", id: "download-otlp" }, "Download OTLP JSON");
  dl.addEventListener("click", () => download(`runs/${enc(ref)}/otlp`, `${summary.run_id}.otlp.json`));
  const facts = [
    ["ref", h("code", {}, summary.ref)],
    ["service", summary.service || ""],
    ["session", summary.session_id ? h("a", { href: `#/session/${enc(summary.session_id)}` }, summary.session_id) : ""],
    ["parent", summary.parent_ref ? h("a", { href: `#/run/${enc(summary.parent_ref)}` }, shortId(summary.parent_ref, 20)) : ""],
    ["start", fmtTime(summary.start_ns)],
    ["duration", fmtDuration(summary.duration_ms)],
    ["model / tool calls", `${summary.model_calls} / ${summary.tool_calls}`],
    ["tokens in / out", `${fmtInt(summary.input_tokens || 0)} / ${fmtInt(summary.output_tokens || 0)}`],
    ["cost", "cost_usd" in summary ? h("span", { id: "run-cost", class: summary.unpriced_calls ? "unpriced" : "",
      title: costTitle(summary.unpriced_calls) }, fmtCost(summary.cost_usd, summary.unpriced_calls) +
      (summary.unpriced_calls ? ` (${summary.unpriced_calls} call${summary.unpriced_calls === 1 ? "" : "s"} without a price)` : "")) : ""],
    ["errors", String(summary.errors || 0)],
    ["models", (summary.models || []).join(", ")],
    ["tools", (summary.tools || []).join(", ")],
    ["source", summary.source || ""],
    ["verification", vcell],
  ].filter(([, v]) => v !== "");
  const tabs = ["steps", "nodes", "timeline", "replay"].map((t) =>
    h("a", { href: `#/run/${enc(ref)}?tab=${t}`, class: `tab ${t === tab ? "active" : ""}`, data: { tab: t } }, t));
  const panel = h("div", { class: "panel", id: `panel-${tab}` });
  put(view, 
    h("div", { class: "bar" }, h("h1", {}, summary.agent || "(unnamed run)"), badge(summary.status),
      h("a", { href: `#/tree/${enc(ref)}`, class: "button" }, "Tree graph"),
      h("a", { href: `#/diff/${enc(ref)}`, class: "button" }, "Diff with…"), dl),
    summary.status_message ? h("p", { class: "error" }, summary.status_message) : null,
    h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("nav", { class: "tabs" }, tabs), panel);
  verification([summary.tape_id]).then((r) => {
    clear(vcell).appendChild(verifyBadge(summary.tape_id, summary.tape_id ? r[summary.tape_id] : null));
  }).catch(() => {});

  if (tab === "steps") {
    const t0 = steps.steps.length ? steps.steps[0].time_ns : summary.start_ns;
    panel.appendChild(h("ol", { class: "steps", id: "steps" }, coalesce(steps.steps).map((st) => stepView(st, t0))));
  } else if (tab === "nodes") {
    const data = await get(`runs/${enc(ref)}/nodes`);
    const t = data.totals;
    panel.append(h("p", { class: "totals" },
      `${t.model_calls} model and ${t.tool_calls} tool nodes · ${fmtDuration(t.duration_ms)} · tokens in ` +
      `${fmtInt(t.usage.input_tokens || 0)} / out ${fmtInt(t.usage.output_tokens || 0)} · ` +
      (t.cost ? `cost ${fmtCost(t.cost.usd, t.cost.unpriced_calls)} · ` : "") + plural(t.errors, "error", "errors")),
    h("div", { class: "nodes", id: "nodes" }, data.nodes.map(nodeView)));
  } else if (tab === "timeline") {
    panel.appendChild(waterfall(await get(`runs/${enc(ref)}/spans`)));
  } else if (tab === "replay") {
    panel.appendChild(jsonFold(await get(`runs/${enc(ref)}/replay`, { tree: 1 }), "agenttape replay --json --tree", true));
  }
  return null;
}
