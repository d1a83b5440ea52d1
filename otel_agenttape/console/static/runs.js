// The runs list: filters, newest first, paged by cursor, kept up to date by polling the first page.

import { AuthNeeded, enc, get, verification } from "./api.js";
import { badge, clear, costTitle, fmtCost, fmtDuration, fmtInt, fmtTime, h, shortId, put } from "./dom.js";

const FILTERS = [
  ["text", "search content"], ["agent", "agent"], ["status", "status"], ["service", "service"],
  ["session", "session"], ["model", "model"], ["tool", "tool"], ["source", "source"],
  ["since", "since (ISO)"], ["until", "until (ISO)"],
];
const POLL_MS = 2000;

export function verifyBadge(tapeId, reports) {
  if (!tapeId) return h("span", { class: "vbadge none", title: "no seal on this run's spans" }, "unsealed");
  if (reports === undefined) return h("span", { class: "vbadge pending" }, "…");
  if (reports === null) return h("span", { class: "vbadge none" }, "unknown");
  const broken = reports.find((r) => !r.valid);
  if (broken) {
    return h("a", { class: "vbadge broken", href: "#/verify", title: broken.reason || "" },
      `broken at ${broken.first_broken_index ?? "?"}`);
  }
  if (!reports.length) return h("span", { class: "vbadge none" }, "no tape");
  return h("a", { class: "vbadge ok", href: "#/verify", title: `tape ${tapeId}` }, "verified");
}

function tokens(r) {
  if (r.input_tokens === null && r.output_tokens === null) return "";
  return `${fmtInt(r.input_tokens || 0)} / ${fmtInt(r.output_tokens || 0)}`;
}

function row(r, selected, onSelect) {
  const box = h("input", { type: "checkbox", title: "select for a diff", "aria-label": "select for diff" });
  box.checked = selected.has(r.ref);
  box.addEventListener("change", () => onSelect(r.ref, box.checked));
  const tr = h("tr", { data: { ref: r.ref } },
    h("td", {}, box),
    h("td", {}, badge(r.status)),
    h("td", { class: "agent" }, h("a", { href: `#/run/${enc(r.ref)}` }, r.agent || "(unnamed)"),
      r.parent_ref ? h("span", { class: "muted child-mark", title: `child of ${r.parent_ref}` }, " ↳ child") : null),
    h("td", { class: "name" }, r.service || ""),
    h("td", { class: "name" }, r.session_id ? h("a", { href: `#/session/${enc(r.session_id)}` }, shortId(r.session_id, 14)) : ""),
    h("td", { class: "num" }, fmtTime(r.start_ns)),
    h("td", { class: "num" }, fmtDuration(r.duration_ms)),
    h("td", { class: "num" }, `${r.model_calls} / ${r.tool_calls}`),
    h("td", { class: "num" }, tokens(r)),
    h("td", { class: `num cost${r.unpriced_calls ? " unpriced" : ""}`, title: costTitle(r.unpriced_calls) },
      fmtCost(r.cost_usd, r.unpriced_calls)),
    h("td", { class: "num" }, r.errors ? h("span", { class: "errors" }, String(r.errors)) : "0"),
    h("td", { class: "vcell" }, verifyBadge(r.tape_id, undefined)),
    h("td", { class: "muted" }, r.source || ""),
    h("td", {}, h("a", { href: `#/tree/${enc(r.ref)}`, title: "the run and every child run as a graph" }, "tree")));
  return tr;
}

export async function runsView(view, params, onError) {
  const filters = {};
  for (const [k] of FILTERS) if (params.get(k)) filters[k] = params.get(k);
  const selected = new Set();
  const form = h("form", { class: "filters", id: "filters" });
  for (const [k, label] of FILTERS) {
    const input = h("input", { name: k, placeholder: label, value: filters[k] || "", size: k === "text" ? 24 : 12 });
    form.appendChild(input);
  }
  form.appendChild(h("button", { type: "submit" }, "Filter"));
  form.appendChild(h("a", { href: "#/", class: "clear" }, "clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const el of form.querySelectorAll("input")) if (el.value.trim()) q.set(el.name, el.value.trim());
    location.hash = `#/?${q}`;
  });
  const diffButton = h("button", { type: "button", id: "diff-selected", disabled: true }, "Diff selected (0/2)");
  diffButton.addEventListener("click", () => {
    const [a, b] = [...selected];
    location.hash = `#/diff/${enc(a)}/${enc(b)}`;
  });
  const onSelect = (ref, on) => {
    if (on) selected.add(ref); else selected.delete(ref);
    diffButton.disabled = selected.size !== 2;
    diffButton.textContent = `Diff selected (${selected.size}/2)`;
  };
  const summary = h("span", { class: "muted", id: "runs-total" });
  const live = h("span", { class: "live", title: `checks for new runs every ${POLL_MS / 1000} s` }, "● live");
  const tbody = h("tbody", { id: "runs-body" });
  const table = h("table", { class: "runs", id: "runs" },
    h("thead", {}, h("tr", {}, ["", "status", "agent", "service", "session", "start", "duration",
      "model / tool", "tokens in / out", "cost", "errors", "verification", "source", ""].map((c) => h("th", {}, c)))),
    tbody);
  const more = h("button", { type: "button", id: "more", hidden: true }, "Load more");
  put(view, h("div", { class: "bar" }, h("h1", {}, "Runs"), summary, live, diffButton), form, table, more);

  let cursor = null;
  let extraPages = false;
  let shown = new Set();

  async function badges(runs) {
    const reports = await verification(runs.map((r) => r.tape_id));
    for (const r of runs) {
      const tr = tbody.querySelector(`tr[data-ref="${CSS.escape(r.ref)}"]`);
      if (!tr) continue;
      const cell = tr.querySelector(".vcell");
      clear(cell).appendChild(verifyBadge(r.tape_id, r.tape_id ? reports[r.tape_id] : null));
    }
  }

  function render(page, append) {
    if (!append) { clear(tbody); shown = new Set(); }
    for (const r of page.runs) {
      if (shown.has(r.ref)) continue;
      shown.add(r.ref);
      tbody.appendChild(row(r, selected, onSelect));
    }
    if (!tbody.firstChild) {
      tbody.appendChild(h("tr", {}, h("td", { colspan: 14, class: "muted empty" }, "No runs match.")));
    }
    summary.textContent = `${fmtInt(page.total)} run${page.total === 1 ? "" : "s"}` +
      (Object.keys(filters).length ? " matching" : "");
    cursor = page.next_cursor;
    more.hidden = !cursor;
    badges(page.runs).catch(() => {});
  }

  more.addEventListener("click", async () => {
    const page = await get("runs", { ...filters, cursor });
    extraPages = true;
    render(page, true);
  });

  const keyOf = (page) => `${page.total}|${page.runs.map((r) => r.ref + r.status).join(",")}`;
  tbody.appendChild(h("tr", {}, h("td", { colspan: 14, class: "muted empty" }, "Loading runs…")));
  const first = await get("runs", filters);
  render(first, false);

  let lastKey = keyOf(first);
  let timer = null;
  let stopped = false;
  // One poll at a time, the next one after the last answer (at least POLL_MS, more for a slow store).
  const poll = async () => {
    if (stopped) return;
    const started = performance.now();
    try {
      if (!document.hidden) {
        const page = await get("runs", filters);
        const key = keyOf(page);
        if (key !== lastKey && !stopped) {
          lastKey = key;
          if (extraPages) {
            // keep what the user paged through: add the new runs on top
            const fresh = page.runs.filter((r) => !shown.has(r.ref)).reverse();
            for (const r of fresh) { shown.add(r.ref); tbody.insertBefore(row(r, selected, onSelect), tbody.firstChild); }
            summary.textContent = `${fmtInt(page.total)} runs`;
            badges(fresh).catch(() => {});
          } else {
            render(page, false);
          }
          live.classList.add("flash");
          setTimeout(() => live.classList.remove("flash"), 600);
        }
      }
    } catch (e) {
      if (e instanceof AuthNeeded) { stopped = true; onError(e); return; }
    }
    if (!stopped) timer = setTimeout(poll, Math.max(POLL_MS, 2 * (performance.now() - started)));
  };
  timer = setTimeout(poll, POLL_MS);
  return () => { stopped = true; clearTimeout(timer); };
}
