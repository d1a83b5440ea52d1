// The agent tree as a node graph: a layered layout (wide fan-outs of leaf runs wrap into a grid fed by a
// bus line), drawn in SVG, panned by dragging and zoomed with the wheel; a click opens that run.

import { enc, get } from "./api.js";
import { clear, fmtCost, fmtDuration, fmtInt, h, plural, s, put } from "./dom.js";

const W = 230, H = 118, GX = 26, GY = 64, ROW_GAP = 46, WRAP = 6;

function isLeaf(n) { return !(n.children || []).length; }

// Sizes first (bottom up), then positions (top down).
function measure(n) {
  const kids = n.children || [];
  kids.forEach(measure);
  if (kids.length > WRAP && kids.every(isLeaf)) {
    n.cols = Math.min(kids.length, Math.max(WRAP, Math.ceil(Math.sqrt(kids.length * 1.7))));
    n.rows = Math.ceil(kids.length / n.cols);
    n.bw = Math.max(W, n.cols * (W + GX) - GX + 24);
    n.bh = H + GY + n.rows * (H + ROW_GAP) - ROW_GAP;
  } else if (kids.length) {
    n.cols = 0;
    const width = kids.reduce((a, c) => a + c.bw, 0) + GX * (kids.length - 1);
    n.bw = Math.max(W, width);
    n.bh = H + GY + Math.max(...kids.map((c) => c.bh));
  } else {
    n.cols = 0; n.bw = W; n.bh = H;
  }
}

function place(n, left, top, nodes, edges) {
  n.x = left + (n.bw - W) / 2;
  n.y = top;
  nodes.push(n);
  const kids = n.children || [];
  const px = n.x + W / 2, py = n.y + H;
  if (n.cols) {
    const gridW = n.cols * (W + GX) - GX;
    const gx = left + (n.bw - gridW) / 2 + 12;
    const gy = top + H + GY;
    const trunkX = gx - 14;
    kids.forEach((c, i) => {
      const r = Math.floor(i / n.cols), col = i % n.cols;
      c.x = gx + col * (W + GX); c.y = gy + r * (H + ROW_GAP);
      c.cols = 0; nodes.push(c);
      const busY = c.y - 16, cx = c.x + W / 2;
      edges.push({ d: `M${px},${py} V${gy - 16} H${trunkX} V${busY} H${cx} V${c.y}`, child: c });
    });
    return;
  }
  let x = left + (n.bw - (kids.reduce((a, c) => a + c.bw, 0) + GX * Math.max(0, kids.length - 1))) / 2;
  for (const c of kids) {
    place(c, x, top + H + GY, nodes, edges);
    const cx = c.x + W / 2;
    edges.push({ d: `M${px},${py} C${px},${py + GY / 2} ${cx},${c.y - GY / 2} ${cx},${c.y}`, child: c });
    x += c.bw + GX;
  }
}

// Text cut to fit a line (SVG has no wrapping): by characters, with an ellipsis.
function cut(text, n) {
  const t = String(text || "").replace(/\s+/g, " ").trim();
  return t.length > n ? t.slice(0, n - 1) + "…" : t;
}

// Up to ``lines`` lines of at most ``n`` characters, broken at spaces; the last one ends in an ellipsis
// when text is left over.
function wrap(text, n, lines) {
  const words = String(text || "").replace(/\s+/g, " ").trim().split(" ").filter(Boolean);
  const out = [];
  let cur = "";
  while (words.length && out.length < lines) {
    let w = words[0];
    if (w.length > n) { w = w.slice(0, n); words[0] = words[0].slice(n); } else words.shift();
    if (!cur) cur = w;
    else if (cur.length + 1 + w.length <= n) cur += " " + w;
    else { out.push(cur); cur = w; }
  }
  if (cur && out.length < lines) out.push(cur); else if (cur) words.unshift(cur);
  if (words.length && out.length) {
    const last = out[out.length - 1];
    out[out.length - 1] = (last.length >= n ? last.slice(0, n - 1) : last) + "…";
  }
  return out;
}

function toolLine(list) {
  if (!list.length) return "no tool calls";
  const counts = new Map();
  for (const t of list) {
    const k = `${t.name || "tool"}${t.error ? " ✖" : ""}`;
    counts.set(k, (counts.get(k) || 0) + 1);
  }
  return [...counts].map(([k, c]) => (c > 1 ? `${k} ×${c}` : k)).join(", ");
}

function nodeBox(n, open) {
  const preview = String(n.output_preview || "");
  const g = s("g", { class: `gnode st-${String(n.status).replace(/[^a-z_]/gi, "")}`, transform: `translate(${n.x},${n.y})`,
    data: { ref: n.ref }, tabindex: 0, role: "link" });
  g.appendChild(s("title", {}, `${n.agent || "(unnamed)"} [${n.status}]\n${n.ref}\n\n${preview}`));
  g.appendChild(s("rect", { class: "box", width: W, height: H, rx: 8, ry: 8 }));
  g.appendChild(s("rect", { class: "stripe", width: 6, height: H, rx: 3, ry: 3 }));
  g.appendChild(s("text", { class: "g-agent", x: 16, y: 21 }, cut(n.agent || "(unnamed)", 25)));
  g.appendChild(s("text", { class: "g-status", x: 16, y: 37 }, `${n.status} · ${fmtDuration(n.duration_ms)}`));
  wrap(preview || "(no output)", 31, 2).forEach((line, i) =>
    g.appendChild(s("text", { class: "g-out", x: 16, y: 57 + i * 16 }, line)));
  g.appendChild(s("text", { class: (n.tool_list || []).length ? "g-tools" : "g-tools none", x: 16, y: 95 },
    cut(toolLine(n.tool_list || []), 31)));
  const meta = `${n.model_calls} model · ${n.tool_calls} tool` +
    ((n.children || []).length ? ` · ${n.children.length} child${n.children.length === 1 ? "" : "ren"}` : "");
  g.appendChild(s("text", { class: "g-meta", x: 16, y: 110 }, cut(meta, 36)));
  g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") open(n.ref); });
  return g;
}

function totals(root) {
  const all = [];
  const walk = (n) => { all.push(n); (n.children || []).forEach(walk); };
  walk(root);
  // each node counted once: a run's tokens are its own model calls, never its children's
  const sum = (k) => all.reduce((a, n) => a + (n[k] || 0), 0);
  return { runs: all.length, input: sum("input_tokens"), output: sum("output_tokens"), models: sum("model_calls"),
    tools: sum("tool_calls"), errors: sum("errors") };
}

export async function treeView(view, ref) {
  const data = await get(`runs/${enc(ref)}/tree`);
  const root = data.root;
  measure(root);
  const nodes = [], edges = [];
  place(root, 0, 0, nodes, edges);
  const t = totals(root);
  const open = (r) => { location.hash = `#/run/${enc(r)}`; };

  const scene = s("g", { class: "scene" });
  for (const e of edges) scene.appendChild(s("path", { class: `edge st-${String(e.child.status).replace(/[^a-z_]/gi, "")}`, d: e.d }));
  for (const n of nodes) scene.appendChild(nodeBox(n, open));
  const svg = s("svg", { class: "graph", id: "graph", width: "100%", height: "100%" }, scene);
  const zoomLabel = h("span", { class: "muted" });
  const tools = h("div", { class: "graph-tools" },
    h("button", { type: "button", id: "zoom-in", title: "zoom in" }, "+"),
    h("button", { type: "button", id: "zoom-out", title: "zoom out" }, "−"),
    h("button", { type: "button", id: "zoom-fit", title: "fit the whole tree" }, "Fit"), zoomLabel);
  const wrap = h("div", { class: "graph-wrap", id: "graph-wrap" }, svg, tools);
  put(view, 
    h("div", { class: "bar" }, h("h1", {}, `Tree of ${root.agent || "(unnamed)"}`),
      h("a", { href: `#/run/${enc(root.ref)}`, class: "button" }, "Open the root run")),
    h("p", { class: "totals" }, `${t.runs} runs · ${t.models} model and ${t.tools} tool calls · tokens in ` +
      `${fmtInt(t.input)} / out ${fmtInt(t.output)}` +
      (data.tree_cost ? ` · cost ${fmtCost(data.tree_cost.usd, data.tree_cost.unpriced_calls)}` : "") +
      ` (each run's own calls, counted once) · ${plural(t.errors, "error", "errors")} · ` +
      "drag to pan, wheel to zoom, click a node to open its run"),
    wrap);

  const contentW = root.bw, contentH = root.bh;
  let k = 1, tx = 0, ty = 0;
  const apply = () => {
    scene.setAttribute("transform", `translate(${tx},${ty}) scale(${k})`);
    zoomLabel.textContent = `${Math.round(k * 100)}%`;
  };
  const fit = () => {
    const r = svg.getBoundingClientRect();
    const vw = r.width || 1000, vh = r.height || 600;
    k = Math.min(1.2, Math.max(0.1, Math.min((vw - 40) / contentW, (vh - 40) / contentH)));
    tx = (vw - contentW * k) / 2;
    ty = Math.max(20, (vh - contentH * k) / 2);
    apply();
  };
  const zoomAt = (factor, cx, cy) => {
    const nk = Math.min(4, Math.max(0.08, k * factor));
    tx = cx - ((cx - tx) * nk) / k;
    ty = cy - ((cy - ty) * nk) / k;
    k = nk;
    apply();
  };
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    zoomAt(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX - r.left, ev.clientY - r.top);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, tx, ty, moved: false, target: ev.target.closest("g.gnode") };
  });
  const move = (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) drag.moved = true;
    if (drag.moved) { tx = drag.tx + dx; ty = drag.ty + dy; apply(); svg.classList.add("panning"); }
  };
  window.addEventListener("pointermove", move);
  const up = () => {
    if (drag && !drag.moved && drag.target) open(drag.target.dataset.ref);
    drag = null;
    svg.classList.remove("panning");
  };
  window.addEventListener("pointerup", up);
  const r = () => { const b = svg.getBoundingClientRect(); return [b.width / 2, b.height / 2]; };
  tools.querySelector("#zoom-in").addEventListener("click", () => zoomAt(1.25, ...r()));
  tools.querySelector("#zoom-out").addEventListener("click", () => zoomAt(1 / 1.25, ...r()));
  tools.querySelector("#zoom-fit").addEventListener("click", fit);
  requestAnimationFrame(fit);
  return () => { window.removeEventListener("pointerup", up); window.removeEventListener("pointermove", move); };
}
