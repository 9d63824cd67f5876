// The workspace list: the project's workspaces a page of the API's list at
// a time, refreshed every two seconds (keyed rows, only changed cells
// rewritten), a label filter, the create form and the lifecycle actions.
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  FailureReason, FailureStage, GuestCondition, NetworkPolicyMode, StopMode, VolumeState, WorkspaceState, WorkspaceVolumeMode,
  type Workspace,
} from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { allPages, api, apiError, command, errorText } from "./api.js";
import { age, bytes, confirmed, field, h, labelsText, mibBytes, parseLabels, setError, wholeNumber } from "./dom.js";
import { canWrite, type Caller } from "./auth.js";
import { clearErrors, showError, type FieldMap } from "./errors.js";
import { visible } from "./text.js";

/** failureText is a failed workspace's failure: message, reason and stage. */
export function failureText(w: Workspace): string {
  const f = w.failure;
  return f ? `${visible(f.message, false)} (reason ${FailureReason[f.reason]}, stage ${FailureStage[f.stage]})` : "";
}

const REFRESH_MS = 2000;

/**
 * PAGE_SIZE is how many workspaces the list shows at once: a page of the
 * API's list, so that a refresh reads, decodes and renders no more than
 * that however many the project holds.
 */
export const PAGE_SIZE = 100;

/** stateName is a workspace state without its prefix, e.g. AVAILABLE. */
export function stateName(s: WorkspaceState): string {
  return WorkspaceState[s] ?? String(s);
}

/** guestText describes the guest observation in a few words. */
export function guestText(w: Workspace): string {
  const g = w.guestObservation;
  if (!g) return "";
  let t = GuestCondition[g.condition] ?? "";
  if (g.restartCount) t += `, ${g.restartCount} resets`;
  if (g.memoryKillCount) t += `, ${g.memoryKillCount} memory kills`;
  return t.toLowerCase();
}

/** resourcesText is cpu, memory and writable layer in a few characters. */
export function resourcesText(w: Workspace): string {
  const r = w.spec?.resources;
  if (!r) return "";
  const cpu = r.cpuMillis ? `${r.cpuMillis / 1000} cpu` : "1 cpu";
  return `${cpu}, ${bytes(r.memoryBytes)}, ${r.writableLayerBytes ? bytes(r.writableLayerBytes) : "default"} disk`;
}


const createFields: FieldMap = [
  [/memory_bytes/, "ws-memory"],
  [/writable_layer_bytes/, "ws-disk"],
  [/cpu/, "ws-cpu"],
  [/network_policy/, "ws-network"],
  [/template/i, "ws-template"],
  [/label/, "ws-labels"],
  [/mount_path/, "ws-mount"],
  [/volume/i, "ws-volume"],
];

/**
 * workspacesView renders the list and, for a caller who may write, the
 * create form and the rows' actions into main until signal aborts.
 */
export function workspacesView(main: HTMLElement, caller: Caller, signal: AbortSignal): void {
  const write = canWrite(caller);
  const template = h("select", { id: "ws-template" });
  const cpu = h("input", { id: "ws-cpu", inputmode: "numeric", value: "0" });
  const memory = h("input", { id: "ws-memory", inputmode: "decimal", value: "256" });
  const disk = h("input", { id: "ws-disk", inputmode: "decimal", value: "0" });
  const network = h("select", { id: "ws-network" },
    h("option", { value: String(NetworkPolicyMode.DENY_ALL) }, "deny all"),
    h("option", { value: String(NetworkPolicyMode.PUBLIC_INTERNET) }, "public internet"));
  const labels = h("input", { id: "ws-labels", placeholder: "team=a, env=dev" });
  const volume = h("select", { id: "ws-volume" }, h("option", { value: "none" }, "none"), h("option", { value: "new" }, "a new volume"));
  const mount = h("input", { id: "ws-mount", placeholder: "/data" });
  const ids = ["ws-template", "ws-cpu", "ws-memory", "ws-disk", "ws-network", "ws-labels", "ws-volume", "ws-mount", "ws-create"];
  const form = h("form", { class: "card create", "aria-labelledby": "create-title" },
    h("h2", { id: "create-title" }, "Create a workspace"),
    h("div", { class: "grid" },
      field("Template", template),
      field("CPU (millicores)", cpu, "0 is one core"),
      field("Memory (MiB)", memory, "a whole number, at least 128"),
      field("Disk (MiB)", disk, "writable layer; 0 is the host's default"),
      field("Network", network),
      field("Volume", volume),
      field("Mounted at", mount, "empty is /data"),
      field("Labels", labels)),
    h("button", { type: "submit" }, "Create"),
    h("p", { id: "ws-create-error", class: "field-error", role: "alert" }),
    h("p", { id: "ws-create-status", class: "status", role: "status" }));
  const submit = form.querySelector("button[type=submit]") as HTMLButtonElement;
  const created = form.querySelector("#ws-create-status") as HTMLElement;
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(ids);
    created.textContent = "";
    const cpuMillis = wholeNumber("ws-cpu", cpu.value);
    const memoryBytes = mibBytes("ws-memory", memory.value);
    const writableLayerBytes = mibBytes("ws-disk", disk.value);
    if (cpuMillis === undefined || memoryBytes === undefined || writableLayerBytes === undefined) return;
    submit.disabled = true; // one create per press, however often it is pressed
    try {
      const { workspace } = await api.workspaces.createWorkspace({
        command: command(),
        spec: {
          template: { templateId: template.value },
          resources: { cpuMillis, memoryBytes, writableLayerBytes },
          networkPolicy: { mode: Number(network.value) },
          volume: volume.value === "none" ? { mode: WorkspaceVolumeMode.NONE }
            : volume.value === "new" ? { mode: WorkspaceVolumeMode.NEW, mountPath: mount.value }
            : { mode: WorkspaceVolumeMode.BOUND, volumeId: volume.value, mountPath: mount.value },
        },
        labels: parseLabels(labels.value),
      });
      created.textContent = `created ${workspace?.workspaceId ?? "a workspace"}`;
      refresh();
    } catch (e) {
      showError(e, createFields, "ws-create");
    } finally {
      submit.disabled = false;
    }
  });
  allPages((pageToken) => api.templates.listTemplates({ pageSize: 1000, pageToken }, { signal }), (r) => r.templates).then((templates) => {
    template.replaceChildren(...templates.map((t) => h("option", { value: t.templateId }, t.templateId)));
  }).catch((e) => setError("ws-template", errorText(apiError(e))));
  allPages((pageToken) => api.volumes.listVolumes({ pageSize: 1000, pageToken }, { signal }), (r) => r.volumes).then((volumes) => {
    volume.append(...volumes.filter((v) => v.state === VolumeState.AVAILABLE && !v.boundWorkspaceId)
      .map((v) => h("option", { value: v.volumeId }, `bind ${v.volumeId} (${bytes(v.spec?.capacityBytes ?? 0n)})`)));
  }).catch((e) => setError("ws-volume", errorText(apiError(e))));

  const filter = h("input", { id: "ws-filter", placeholder: "team=a" });
  const status = h("p", { id: "ws-status", class: "status", role: "status" });
  // The page tokens of the pages up to the one shown ("" is the first),
  // and the next page's.
  let pages = [""];
  let next = "";
  const prev = h("button", { type: "button", class: "small", id: "ws-prev", disabled: true,
    onclick: () => { pages.pop(); refresh(); } }, "Previous page");
  const more = h("button", { type: "button", class: "small", id: "ws-next", disabled: true,
    onclick: () => { if (next) { pages.push(next); refresh(); } } }, "Next page");
  const tbody = h("tbody");
  const table = h("table", { class: "list", "aria-label": "Workspaces" },
    h("thead", null, h("tr", null, ...["Workspace", "State", "Template", "Resources", "Volume", "Labels", "Guest", "Age", ...(write ? ["Actions"] : [])]
      .map((c) => h("th", { scope: "col" }, c)))), tbody);
  main.replaceChildren(h("h1", null, "Workspaces"), write ? form : h("p", { id: "ws-create-error", class: "field-error", role: "alert" }),
    h("section", { class: "card", "aria-labelledby": "list-title" },
      h("h2", { id: "list-title" }, "Workspaces"),
      field("Filter by labels", filter), h("div", { class: "toolbar" }, prev, more, status), h("div", { class: "scroll" }, table)));

  const rows = new Map<string, { tr: HTMLTableRowElement; cells: HTMLTableCellElement[]; state: WorkspaceState }>();
  let timer = 0;
  let reads = 0; // the latest read's number: an earlier one that ends later is dropped
  async function refresh() {
    window.clearTimeout(timer);
    const read = ++reads;
    try {
      const r = await api.workspaces.listWorkspaces(
        { pageSize: PAGE_SIZE, pageToken: pages[pages.length - 1], labelSelector: parseLabels(filter.value) }, { signal });
      if (read !== reads) return;
      const list = r.workspaces.filter((w) => w.state !== WorkspaceState.DELETED);
      next = r.nextPageToken;
      render(list);
      const first = (pages.length - 1) * PAGE_SIZE;
      status.textContent = list.length ? `workspaces ${first + 1} to ${first + list.length}${next ? "; more on the next page" : ""}` : "no workspaces";
      prev.disabled = pages.length === 1;
      more.disabled = !next;
      setError("ws-filter", "");
    } catch (e) {
      if (signal.aborted || read !== reads) return;
      setError("ws-filter", errorText(apiError(e)));
    }
    if (!signal.aborted) timer = window.setTimeout(refresh, REFRESH_MS);
  }
  filter.addEventListener("change", () => {
    // A page token holds only for the selector it was issued with.
    pages = [""];
    refresh();
  });
  signal.addEventListener("abort", () => window.clearTimeout(timer));

  function render(list: Workspace[]) {
    const seen = new Set<string>();
    const now = Date.now();
    list.forEach((w, i) => {
      seen.add(w.workspaceId);
      let row = rows.get(w.workspaceId);
      if (!row) {
        const cells = Array.from({ length: 8 }, () => h("td"));
        cells[0].append(h("a", { href: `#/workspaces/${w.workspaceId}` }, w.workspaceId));
        const tr = h("tr", { "data-id": w.workspaceId }, ...cells, write ? h("td", { class: "actions" }, ...actions(w.workspaceId)) : null);
        row = { tr, cells, state: w.state };
        rows.set(w.workspaceId, row);
      }
      row.state = w.state;
      const vol = w.spec?.volume?.volumeId ?? "";
      const texts = [null, stateName(w.state), w.spec?.template?.templateId ?? "", resourcesText(w), vol, labelsText(w.labels),
        guestText(w), age(w.createdAt ? timestampDate(w.createdAt) : undefined, now)];
      texts.forEach((t, j) => {
        if (t !== null && row.cells[j].textContent !== t) row.cells[j].textContent = t;
      });
      row.cells[1].className = `state ${stateName(w.state).toLowerCase()}`;
      row.cells[1].title = w.failure ? failureText(w) : "";
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] ?? null);
    });
    for (const [id, row] of rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        rows.delete(id);
      }
    }
  }

  function actions(id: string): HTMLElement[] {
    const act = (label: string, run: () => Promise<unknown>) =>
      h("button", {
        type: "button", class: "small", "aria-label": `${label} ${id}`,
        onclick: async () => {
          setError("ws-create", "");
          try {
            await run();
            refresh();
          } catch (e) {
            setError("ws-create", `${label} ${id}: ${errorText(apiError(e))}`);
          }
        },
      }, label);
    return [
      act("Start", () => api.workspaces.startWorkspace({ command: command(), workspaceId: id })),
      act("Stop", () => api.workspaces.stopWorkspace({ command: command(), workspaceId: id, mode: StopMode.NORMAL })),
      act("Force stop", () => api.workspaces.stopWorkspace({ command: command(), workspaceId: id, mode: StopMode.FORCE })),
      confirmed("Delete", id, () => api.workspaces.deleteWorkspace({ command: command(), workspaceId: id })),
    ];
  }
  refresh();
}
