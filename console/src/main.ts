// The console's entry: sign-in, the header, and a router over the hash
// (#/workspaces, #/workspaces/ID/TAB, #/resources). The token never goes
// into a URL.
import "./style.css";
import { Code, ConnectError } from "@connectrpc/connect";
import { apiError, errorText, setToken, token, TOKEN_REFUSED } from "./api.js";
import { signInView, whoami, type Caller } from "./auth.js";
import { workspaceView } from "./detail.js";
import { h } from "./dom.js";
import { resourcesView } from "./resources.js";
import { workspacesView } from "./workspaces.js";

const main = document.getElementById("main")!;
const nav = document.getElementById("nav")!;
const who = document.getElementById("who")!;
let caller: Caller | undefined;
let view: AbortController | undefined;

function signedIn(c: Caller) {
  caller = c;
  who.replaceChildren(
    h("span", { id: "who-project" }, `project ${c.projectName}${c.operator ? " (operator)" : ""}`), " · ",
    h("span", { id: "who-role" }, `role ${c.role}`), " ",
    h("button", { type: "button", class: "small", onclick: signOut }, "Sign out"));
  nav.hidden = false;
  nav.replaceChildren(h("a", { href: "#/workspaces" }, "Workspaces"), h("a", { href: "#/resources" }, "Resources"));
  route();
}

/** signOut forgets the token and reloads, which drops every data-plane session the page held. */
function signOut() {
  setToken(null);
  location.hash = "";
  location.reload();
}

function route() {
  if (!caller) return;
  view?.abort();
  view = new AbortController();
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  for (const a of nav.querySelectorAll("a")) {
    if (a.getAttribute("href") === `#/${parts[0] ?? "workspaces"}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (parts[0] === "resources") resourcesView(main, caller, view.signal);
  else if (parts[0] === "workspaces" && parts[1]) workspaceView(main, caller, decodeURIComponent(parts[1]), parts[2] ?? "overview", view.signal);
  else workspacesView(main, caller, view.signal);
  main.focus({ preventScroll: true });
}

/** signedOut leaves the page for the sign-in form, saying why. */
function signedOut(notice: string) {
  view?.abort();
  caller = undefined;
  setToken(null);
  nav.hidden = true;
  who.replaceChildren();
  signInView(main, signedIn, notice);
}

window.addEventListener("hashchange", route);
window.addEventListener(TOKEN_REFUSED, (ev) => {
  if (caller) signedOut(`The control plane no longer takes your token (${(ev as CustomEvent<string>).detail}); sign in again.`);
});
const saved = token();
if (saved) {
  whoami().then(signedIn, (e) => {
    // A refused token is forgotten; one the page could not check (the
    // server restarts) is kept for a reload.
    if (ConnectError.from(e).code === Code.Unauthenticated) signedOut("The token of this tab is no longer valid; sign in again.");
    else signInView(main, signedIn, `Could not reach the control plane (${errorText(apiError(e))}); reload to try again.`);
  });
}
else signInView(main, signedIn);
