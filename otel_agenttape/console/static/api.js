// The read API: every call carries the bearer token kept for this browser session.

const KEY = "agenttape.console.token";

export class AuthNeeded extends Error {}
export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export function token() { return sessionStorage.getItem(KEY) || ""; }
export function setToken(t) { if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY); }

function headers() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

export function enc(ref) { return encodeURIComponent(ref); }

export async function get(path, params) {
  const qs = params ? new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "")) : null;
  const url = `/api/${path}${qs && [...qs].length ? "?" + qs : ""}`;
  const res = await fetch(url, { headers: headers(), cache: "no-store" });
  if (res.status === 401) throw new AuthNeeded("token needed");
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) throw new ApiError(res.status, (body && body.error) || `HTTP ${res.status}`);
  return body;
}

// A download that needs the token: fetch it, then hand the browser a local blob.
export async function download(path, filename) {
  const res = await fetch(`/api/${path}`, { headers: headers() });
  if (res.status === 401) throw new AuthNeeded("token needed");
  if (!res.ok) throw new ApiError(res.status, `HTTP ${res.status}`);
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 5000);
}

const verified = new Map();

// Verification of tapes, asked once per tape id and remembered for the page's life.
export async function verification(tapeIds) {
  const want = [...new Set(tapeIds.filter((t) => t && !verified.has(t)))];
  await Promise.all(want.map(async (t) => {
    try {
      const r = await get("verify", { tape: t });
      verified.set(t, r.tapes);
    } catch (e) {
      if (e instanceof AuthNeeded) throw e;
      verified.set(t, null);
    }
  }));
  const out = {};
  for (const t of tapeIds) if (t) out[t] = verified.get(t);
  return out;
}

export function forgetVerification() { verified.clear(); }

// Annotating: the annotate token is asked for when first needed and kept for the browser session,
// sent only as the X-Agenttape-Annotate-Token header (never a cookie), beside the read token.
const ANNOTATE_KEY = "agenttape.console.annotate";
export function annotateToken() { return sessionStorage.getItem(ANNOTATE_KEY) || ""; }
export function setAnnotateToken(t) { if (t) sessionStorage.setItem(ANNOTATE_KEY, t); else sessionStorage.removeItem(ANNOTATE_KEY); }

export async function postScore(ref, score) {
  const res = await fetch(`/api/runs/${enc(ref)}/scores`, {
    method: "POST", cache: "no-store", body: JSON.stringify(score),
    headers: { ...headers(), "Content-Type": "application/json", "X-Agenttape-Annotate-Token": annotateToken() },
  });
  if (res.status === 401) throw new AuthNeeded("token needed");
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) throw new ApiError(res.status, (body && body.error) || `HTTP ${res.status}`);
  return body;
}
