// DOM helpers that only ever put content into the page as text (never as HTML).

const SVGNS = "http://www.w3.org/2000/svg";
const SAFE_ATTRS = new Set(["class", "title", "id", "type", "name", "value", "placeholder", "for", "colspan",
  "role", "aria-label", "autocomplete", "size", "min", "max", "step", "checked", "disabled", "hidden",
  "selected", "download", "tabindex", "open", "rows", "spellcheck"]);

function append(el, child) {
  if (child === null || child === undefined || child === false) return;
  if (Array.isArray(child)) { child.forEach((c) => append(el, c)); return; }
  if (child instanceof Node) { el.appendChild(child); return; }
  el.appendChild(document.createTextNode(String(child)));
}

function setProps(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") { el.addEventListener(k.slice(2), v); continue; }
    if (k === "href") {
      // in-page routes only: content never becomes a link target
      const s = String(v);
      if (s.startsWith("#")) el.setAttribute("href", s);
      continue;
    }
    if (k === "data") { for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv); continue; }
    if (SAFE_ATTRS.has(k)) el.setAttribute(k, v === true ? "" : String(v));
  }
}

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k.startsWith("on") && typeof v === "function") { el.addEventListener(k.slice(2), v); continue; }
    if (k === "data") { for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv); continue; }
    el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

// Replace an element's children (null/false children are skipped, strings become text).
export function put(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  if (ms < 1) return `${(ms * 1000).toFixed(0)} µs`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function fmtTime(ns) {
  if (!ns) return "";
  const d = new Date(Number(BigInt(ns) / 1000000n));
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:` +
    `${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function fmtInt(n) {
  if (n === null || n === undefined) return "";
  return Number(n).toLocaleString("en-US");
}

// Dollars as pricing.format_usd writes them; a cost no price was found for is "unknown", never $0.
export function fmtUsd(usd) {
  if (usd === null || usd === undefined) return "unknown";
  const v = Number(usd);
  if (v === 0) return "$0";
  if (Math.abs(v) >= 1) return `$${v.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
  return Math.abs(v) >= 0.0001 ? `$${v.toFixed(4)}` : `$${v.toFixed(6)}`;
}

// A run's (or a total's) cost: "$0.0123", "$0.0123 +2?" (2 calls without a price), "unknown".
export function fmtCost(usd, unpriced) {
  if (usd === null || usd === undefined) return unpriced ? "unknown" : "$0";
  return fmtUsd(usd) + (unpriced ? ` +${unpriced}?` : "");
}

export function costTitle(unpriced) {
  return unpriced ? `${unpriced} model call${unpriced === 1 ? "" : "s"} without a price: cost unknown, not 0` : "";
}

export function shortId(id, n = 8) {
  const s = String(id || "");
  return s.length > n + 2 ? s.slice(0, n) + "…" : s;
}

export function asText(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {
    const area = h("textarea", {}, text);
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e2) { /* nothing more to try */ }
    area.remove();
  }
  const was = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = was; }, 1200);
}

export function copyButton(getText) {
  const b = h("button", { type: "button", class: "copy", title: "Copy to the clipboard" }, "Copy");
  b.addEventListener("click", (ev) => { ev.preventDefault(); ev.stopPropagation(); copy(getText(), b); });
  return b;
}

// "1 key", "3 keys" (wrapped in ``open``/``close``).
export function plural(n, one, many, open = "", close = "") {
  return `${open}${n} ${n === 1 ? one : many}${close}`;
}

// Folded JSON: a summary line, the indented JSON as text, and a copy button.
export function jsonFold(value, label, open = false) {
  const text = asText(value);
  let what = "";
  if (Array.isArray(value)) what = `[${value.length}]`;
  else if (value && typeof value === "object") what = plural(Object.keys(value).length, "key", "keys", "{", "}");
  else what = `${text.length} chars`;
  const d = h("details", { class: "json", open: open || undefined },
    h("summary", {}, label ? `${label} ` : "", h("span", { class: "muted" }, what), copyButton(() => text)),
    h("pre", {}, text));
  return d;
}

// Long text collapsed to its first lines, with a button that shows all of it.
export function longText(value, cls = "text", limit = 700) {
  const text = asText(value);
  const lines = text.split("\n");
  const el = h("div", { class: `${cls} long` });
  const pre = h("pre", {});
  el.appendChild(pre);
  if (text.length <= limit && lines.length <= 14) {
    pre.textContent = text;
    return el;
  }
  let cut = text.slice(0, limit);
  if (cut.split("\n").length > 14) cut = lines.slice(0, 14).join("\n");
  pre.textContent = cut + " …";
  const more = h("button", { type: "button", class: "link more" }, `Show all (${fmtInt(text.length)} chars)`);
  let shown = false;
  more.addEventListener("click", () => {
    shown = !shown;
    pre.textContent = shown ? text : cut + " …";
    more.textContent = shown ? "Show less" : `Show all (${fmtInt(text.length)} chars)`;
  });
  el.appendChild(more);
  return el;
}

// A value as text when it is text, folded JSON otherwise.
export function valueView(value, label) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "(none)");
  if (typeof value === "string") {
    const t = value.trim();
    if ((t.startsWith("{") && t.endsWith("}")) || (t.startsWith("[") && t.endsWith("]"))) {
      try { return jsonFold(JSON.parse(t), label, true); } catch (e) { /* plain text */ }
    }
    return longText(value);
  }
  return jsonFold(value, label, true);
}

export function badge(status) {
  const st = String(status || "unknown");
  return h("span", { class: `badge st-${st.replace(/[^a-z_]/gi, "")}` }, st);
}
