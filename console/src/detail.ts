// One workspace's page: its overview (kept live by WatchWorkspace), and
// tabs for the terminal, files and network policy.
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { StopMode, WorkspaceExpirationAction, WorkspaceState, type Workspace } from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { api, apiError, command, errorText } from "./api.js";
import { canWrite, type Caller } from "./auth.js";
import { age, append, confirmed, foreign, h, labelsText } from "./dom.js";
import { editForms } from "./edit.js";
import { filesView } from "./files.js";
import { networkView } from "./network.js";
import { terminalView } from "./terminal.js";
import { visible } from "./text.js";
import { failureText, guestText, resourcesText, stateName } from "./workspaces.js";

const TABS = ["overview", "terminal", "files", "network"] as const;
type Tab = (typeof TABS)[number];
const READ_TABS: readonly Tab[] = ["overview", "network"];

/**
 * Live is the latest state of a watched workspace; views subscribe to it,
 * and to its end: why the workspace can no longer be watched.
 */
export class Live {
  current?: Workspace;
  ended?: string;
  private readonly subs = new Set<(w: Workspace) => void>();
  private readonly ends = new Set<(why: string) => void>();
  subscribe(f: (w: Workspace) => void, signal: AbortSignal): void {
    this.subs.add(f);
    signal.addEventListener("abort", () => this.subs.delete(f));
    if (this.current) f(this.current);
  }
  set(w: Workspace): void {
    this.current = w;
    for (const f of this.subs) f(w);
  }
  /** onEnd runs f once the watch ended for good, with why. */
  onEnd(f: (why: string) => void, signal: AbortSignal): void {
    this.ends.add(f);
    signal.addEventListener("abort", () => this.ends.delete(f));
    if (this.ended !== undefined) f(this.ended);
  }
  end(why: string): void {
    this.ended = why;
    for (const f of this.ends) f(why);
  }
}

/**
 * FINAL are the codes a watch does not ask again after: the workspace is
 * not there (another project's, or pruned) or the caller may not read it,
 * which no retry changes. Any other error (unavailable, a broken
 * connection) is retried.
 */
const FINAL: ReadonlySet<Code> = new Set([Code.NotFound, Code.PermissionDenied, Code.InvalidArgument, Code.Unauthenticated, Code.Unimplemented]);

/**
 * watch keeps live up to date: WatchWorkspace, reopened after a break,
 * polling GetWorkspace meanwhile, until signal aborts or an answer is
 * FINAL, which ends live.
 */
async function watch(id: string, live: Live, signal: AbortSignal, onError: (msg: string) => void) {
  const final = (e: unknown) => {
    if (!FINAL.has(ConnectError.from(e).code)) return false;
    live.end(errorText(apiError(e)));
    return true;
  };
  // A DELETED workspace changes no more: its watch ends after its state.
  const deleted = () => {
    if (live.current?.state !== WorkspaceState.DELETED) return false;
    live.end(`workspace ${visible(id)} was deleted`);
    return true;
  };
  while (!signal.aborted) {
    try {
      for await (const r of api.workspaces.watchWorkspace({ workspaceId: id }, { signal })) {
        if (r.workspace) live.set(r.workspace);
        onError("");
      }
      if (deleted()) return;
    } catch (e) {
      if (signal.aborted || final(e)) return;
      onError(errorText(apiError(e)));
      try {
        const r = await api.workspaces.getWorkspace({ workspaceId: id }, { signal });
        if (r.workspace) live.set(r.workspace);
        if (deleted()) return;
      } catch (e) {
        if (signal.aborted || final(e)) return;
        // else the next round says why
      }
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
}

/**
 * workspaceView renders workspace id's page with the tab shown until
 * signal aborts. A viewer sees no actions, and no terminal or files (a
 * data-plane session is a write).
 */
export function workspaceView(main: HTMLElement, caller: Caller, id: string, tab: string, signal: AbortSignal): void {
  const write = canWrite(caller);
  const tabs = write ? TABS : READ_TABS;
  const t: Tab = (tabs as readonly string[]).includes(tab) ? (tab as Tab) : "overview";
  const live = new Live();
  const state = h("span", { id: "ws-state", class: "state", "aria-live": "polite" });
  const error = h("p", { id: "ws-error", class: "field-error", role: "alert" });
  const nav = h("nav", { class: "tabs", "aria-label": "Workspace" },
    ...tabs.map((name) => h("a", { href: `#/workspaces/${id}/${name}`, "aria-current": name === t ? "page" : undefined }, name)));
  const body = h("section", { id: `tab-${t}`, class: "card", "aria-label": t });
  const act = (label: string, run: () => Promise<unknown>) =>
    h("button", {
      type: "button", class: "small",
      onclick: async () => {
        error.textContent = "";
        try {
          await run();
        } catch (e) {
          error.textContent = errorText(apiError(e));
        }
      },
    }, label);
  main.replaceChildren();
  append(main,
    // The ID comes from the URL, which anyone can write a link to.
    h("h1", null, h("a", { href: "#/workspaces" }, "Workspaces"), " / ", foreign(id), " ", state),
    write && h("div", { class: "toolbar" },
      act("Start", () => api.workspaces.startWorkspace({ command: command(), workspaceId: id })),
      act("Stop", () => api.workspaces.stopWorkspace({ command: command(), workspaceId: id, mode: StopMode.NORMAL })),
      act("Force stop", () => api.workspaces.stopWorkspace({ command: command(), workspaceId: id, mode: StopMode.FORCE })),
      confirmed("Delete", visible(id), () => api.workspaces.deleteWorkspace({ command: command(), workspaceId: id }),
        (e) => (error.textContent = errorText(apiError(e))))),
    error, nav, body);
  live.subscribe((w) => {
    state.textContent = stateName(w.state);
    state.className = `state ${stateName(w.state).toLowerCase()}`;
  }, signal);
  live.onEnd((why) => (error.textContent = why), signal);
  watch(id, live, signal, (msg) => (error.textContent = msg));
  switch (t) {
    case "overview":
      overview(body, id, live, write, signal);
      break;
    case "terminal":
      whenAvailable(body, live, signal, () => terminalView(body, id, signal));
      break;
    case "files":
      whenAvailable(body, live, signal, () => filesView(body, id, signal));
      break;
    case "network":
      networkView(body, id, live, write, signal);
      break;
  }
}

/**
 * whenAvailable runs open once the workspace is AVAILABLE (the data plane
 * needs an execution), or says why it never will be once the watch ended.
 */
function whenAvailable(body: HTMLElement, live: Live, signal: AbortSignal, open: () => void) {
  let opened = false;
  body.replaceChildren(h("p", { role: "status" }, "Waiting for the workspace to be AVAILABLE…"));
  live.subscribe((w) => {
    if (!opened && w.state === WorkspaceState.AVAILABLE) {
      opened = true;
      open();
    }
  }, signal);
  live.onEnd((why) => {
    if (!opened) body.replaceChildren(h("p", { role: "status" }, `The workspace cannot be opened: ${why}`));
  }, signal);
}

function overview(body: HTMLElement, id: string, live: Live, write: boolean, signal: AbortSignal) {
  const dl = h("dl", { class: "facts" });
  body.replaceChildren(h("h2", null, "Overview"), dl);
  if (write) editForms(body, id, live, signal);
  live.subscribe((w) => {
    const facts: [string, string][] = [
      ["State", stateName(w.state)],
      ["Failure", failureText(w)],
      ["Template", `${w.spec?.template?.templateId ?? ""} ${w.spec?.template?.revision ?? ""}`],
      ["Resources", resourcesText(w)],
      ["Volume", w.spec?.volume?.volumeId ? `${w.spec.volume.volumeId} at ${w.spec.volume.mountPath}` : "none"],
      ["Labels", labelsText(w.labels)],
      ["Guest", guestText(w)],
      ["Generation", String(w.generation)],
      ["Expiration", w.expiration?.policy?.deadline ? `${timestampDate(w.expiration.policy.deadline).toISOString()}, then ${WorkspaceExpirationAction[w.expiration.policy.action]}` : ""],
      ["Network policy", `revision ${w.spec?.networkPolicy?.revision ?? 0}, applied ${w.networkPolicyStatus?.appliedRevision ?? 0}`],
      ["Created", w.createdAt ? `${timestampDate(w.createdAt).toISOString()} (${age(timestampDate(w.createdAt))} ago)` : ""],
    ];
    dl.replaceChildren(...facts.filter(([, v]) => v).flatMap(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
  }, signal);
}
