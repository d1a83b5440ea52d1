// A session's turns, a diff of two runs side by side, and the verification of every tape.

import { enc, get } from "./api.js";
import { badge, clear, fmtCost, fmtDuration, fmtTime, h, jsonFold, longText, shortId, valueView, put } from "./dom.js";
import { chat } from "./run.js";

export async function sessionView(view, id) {
  const data = await get(`sessions/${enc(id)}`);
  put(view, 
    h("div", { class: "bar" }, h("h1", {}, "Session"), h("code", {}, id),
      h("span", { class: "muted" }, `${data.turns.length} turn${data.turns.length === 1 ? "" : "s"}`),
      data.cost ? h("span", { class: "muted", id: "session-cost" },
        `cost ${fmtCost(data.cost.usd, data.cost.unpriced_calls)}`) : null),
    h("ol", { class: "turns", id: "turns" }, data.turns.map((t, i) => h("li", { class: "turn", data: { ref: t.ref } },
      h("div", { class: "turn-head" }, h("strong", {}, `Turn ${i + 1}`), " ",
        h("a", { href: `#/run/${enc(t.ref)}` }, t.agent || "(unnamed)"), " ", badge(t.status),
        h("span", { class: "muted" }, ` ${fmtTime(t.start_ns)} · ${fmtDuration(t.duration_ms)}` +
          ("cost_usd" in t ? ` · ${fmtCost(t.cost_usd, t.unpriced_calls)}` : ""))),
      chat((t.input || []).filter((m) => m.role !== "system")),
      h("div", { class: "msg role-assistant" }, h("div", { class: "role" }, "output"), longText(t.output || "", "content")))))
  );
}

function sideCell(node) {
  if (!node) return h("td", { class: "muted" }, "(no node)");
  return h("td", {},
    h("div", { class: "node-head" }, h("span", { class: `ntype t-${node.type}` }, node.type),
      h("strong", {}, node.type === "model" ? (node.model || node.name) : (node.tool || node.name || "end")),
      node.status ? badge(node.status) : null),
    node.type === "model" ? [chat(node.input), h("div", { class: "assistant" }, longText(node.output || "", "content"))]
      : node.type === "tool" ? [valueView(node.arguments, "arguments"), valueView(node.error || node.result, node.error ? "error" : "result")]
        : valueView(node.output, "output"));
}

function pickForm(a, b) {
  const ia = h("input", { name: "a", placeholder: "run ref A", value: a || "", size: 50 });
  const ib = h("input", { name: "b", placeholder: "run ref B", value: b || "", size: 50 });
  const f = h("form", { class: "filters", id: "diff-form" }, ia, ib, h("button", { type: "submit" }, "Compare"));
  f.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = `#/diff/${enc(ia.value.trim())}/${enc(ib.value.trim())}`;
  });
  return f;
}

export async function diffView(view, a, b) {
  put(view, h("div", { class: "bar" }, h("h1", {}, "Diff")), pickForm(a, b));
  if (!a || !b) {
    view.appendChild(h("p", { class: "muted" }, "Pick two runs (or tick two rows in the runs list)."));
    return;
  }
  const d = await get("diff", { a, b });
  const first = d.first_divergence;
  view.appendChild(h("p", { class: d.diverged ? "error" : "ok", id: "diff-verdict" }, d.diverged
    ? `The runs diverge at node ${first.index} (${first.fields.join(", ")}).`
    : `The runs match (${d.nodes_a.length} nodes).`));
  const rows = [];
  const n = Math.max(d.nodes_a.length, d.nodes_b.length, first ? first.index + 1 : 0);
  for (let i = 0; i < n; i++) {
    const isFirst = first && first.index === i;
    const left = i < d.nodes_a.length ? d.nodes_a[i] : (isFirst ? first.a : null);
    const right = i < d.nodes_b.length ? d.nodes_b[i] : (isFirst ? first.b : null);
    rows.push(h("tr", { class: isFirst ? "diverge" : (first && i > first.index ? "after" : ""), data: { index: i } },
      h("th", {}, String(i), isFirst ? h("div", { class: "fields" }, first.fields.join(", ")) : null),
      sideCell(left), sideCell(right)));
  }
  view.appendChild(h("table", { class: "diff", id: "diff" },
    h("thead", {}, h("tr", {}, h("th", {}, "#"),
      h("th", {}, h("a", { href: `#/run/${enc(d.ref_a || a)}` }, `A ${d.agent_a || "(unnamed)"}`),
        h("span", { class: "muted mono" }, ` ${shortId(d.ref_a || a, 16)}`)),
      h("th", {}, h("a", { href: `#/run/${enc(d.ref_b || b)}` }, `B ${d.agent_b || "(unnamed)"}`),
        h("span", { class: "muted mono" }, ` ${shortId(d.ref_b || b, 16)}`)))),
    h("tbody", {}, rows)));
  if (first) view.appendChild(jsonFold(first, "first divergence JSON"));
  const hit = view.querySelector("tr.diverge");
  if (hit) hit.scrollIntoView({ block: "center" });
}

export async function verifyView(view) {
  const data = await get("verify");
  const tapes = data.tapes;
  const broken = tapes.filter((t) => !t.valid).length;
  put(view, 
    h("div", { class: "bar" }, h("h1", {}, "Verification"),
      h("span", { class: broken ? "error" : "ok" }, `${tapes.length} tape${tapes.length === 1 ? "" : "s"}, ${broken} broken`)),
    tapes.length ? null : h("p", { class: "muted" }, "No sealed tapes in this store."),
    h("div", { class: "tapes", id: "tapes" }, tapes.map((t) => h("section", { class: `tape ${t.valid ? "valid" : "broken"}`, data: { tape: t.chain_id } },
      h("div", { class: "node-head" },
        h("span", { class: `vbadge ${t.valid ? "ok" : "broken"}` }, t.valid ? "verified" : `broken at index ${t.first_broken_index}`),
        h("strong", {}, "tape "), h("a", { href: `#/?text=${enc(t.chain_id)}` }, t.chain_id),
        h("span", { class: "muted" }, ` epoch ${t.epoch} · ${t.length} sealed spans` + (t.trace_id ? ` · trace ${t.trace_id}` : ""))),
      t.valid ? null : h("p", { class: "error reason" }, t.reason || ""),
      (t.issues || []).length ? h("ul", { class: "issues" }, t.issues.map((i) => h("li", {}, `[${i.kind}] index ${i.index}: ${i.reason}`))) : null,
      h("dl", { class: "facts" },
        h("dt", {}, "head"), h("dd", {}, h("code", {}, t.head || "")),
        h("dt", {}, "Merkle root"), h("dd", {}, h("code", {}, t.root || "")),
        h("dt", {}, "checkpoints checked"), h("dd", {}, String(t.checkpoints_checked)),
        h("dt", {}, "covered by a pinned key"), h("dd", {}, t.key_pinned ? String(t.signed_size) : "no key pinned (agenttape verify --key)")),
      h("table", { class: "cps" }, h("thead", {}, h("tr", {}, ["size", "root", "chain head", "signed by", "from"].map((c) => h("th", {}, c)))),
        h("tbody", {}, (t.checkpoints || []).map((c) => h("tr", {},
          h("td", { class: "num" }, String(c.size)), h("td", {}, h("code", {}, c.root)), h("td", {}, h("code", {}, shortId(c.chain_head, 16))),
          h("td", {}, c.signatures.map((sg) => `${sg.key} (${sg.key_id})`).join(", ")), h("td", {}, c.source)))))))));
}
