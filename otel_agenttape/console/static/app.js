// The console's router: a hash route per page; each view renders into <main> as text-only DOM.

import { AuthNeeded, ApiError, get, setToken, token } from "./api.js";
import { clear, h } from "./dom.js";
import { runsView } from "./runs.js";
import { runView } from "./run.js";
import { treeView } from "./tree.js";
import { diffView, sessionView, verifyView } from "./pages.js";
import { experimentView, experimentsView } from "./experiments.js";

const view = document.getElementById("view");
let stopCurrent = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query || "") };
}

function loginView(message) {
  clear(view);
  const input = h("input", { type: "password", name: "token", id: "token", autocomplete: "current-password",
    placeholder: "token", size: 40 });
  const form = h("form", { class: "login", id: "login" },
    h("h1", {}, "This console needs its token"),
    h("p", { class: "muted" }, "The token is kept in this browser tab's session only and sent as a bearer header."),
    message ? h("p", { class: "error" }, message) : null,
    h("label", { for: "token" }, "Token "), input, " ",
    h("button", { type: "submit" }, "Open"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    setToken(input.value.trim());
    route();
  });
  view.appendChild(form);
  input.focus();
}

function showError(err) {
  document.body.dataset.hash = location.hash;
  document.body.dataset.ready = "error";
  if (err instanceof AuthNeeded) {
    document.body.dataset.ready = "login";
    loginView(token() ? "That token was refused." : "");
    return;
  }
  clear(view);
  view.appendChild(h("div", { class: "error-box" },
    h("h1", {}, err instanceof ApiError && err.status === 404 ? "Not found" : "Something went wrong"),
    h("p", {}, String(err.message || err)),
    h("p", {}, h("a", { href: "#/" }, "Back to the runs"))));
}

function markNav(name) {
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === name));
}

export async function route() {
  if (stopCurrent) { stopCurrent(); stopCurrent = null; }
  const { parts, params } = parseHash();
  document.getElementById("logout").hidden = !token();
  document.body.dataset.ready = "";
  try {
    const src = document.getElementById("source");
    if (!src.textContent) get("info").then((i) => { src.textContent = i.source || ""; }).catch(() => {});
    const [page, a, b] = parts;
    let stop = null;
    if (!page) { markNav("runs"); stop = await runsView(view, params, showError); }
    else if (page === "run") { markNav("runs"); stop = await runView(view, a, params); }
    else if (page === "tree") { markNav("runs"); stop = await treeView(view, a); }
    else if (page === "session") { markNav("runs"); await sessionView(view, a); }
    else if (page === "diff") { markNav("diff"); await diffView(view, a || params.get("a"), b || params.get("b")); }
    else if (page === "experiments") { markNav("experiments"); await experimentsView(view); }
    else if (page === "experiment") { markNav("experiments"); await experimentView(view, a, params); }
    else if (page === "verify") { markNav("verify"); await verifyView(view); }
    else throw new ApiError(404, `no page ${page}`);
    stopCurrent = stop;
    document.body.dataset.hash = location.hash;
    document.body.dataset.ready = page || "runs";
  } catch (err) {
    showError(err);
  }
}

async function start() {
  document.getElementById("logout").addEventListener("click", () => { setToken(""); route(); });
  window.addEventListener("hashchange", route);
  route();
}

start();
