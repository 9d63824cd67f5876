// Changes to a workspace from its overview: memory, writable layer and
// labels (each a CAS on the revision the page last saw) and expiration.
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { WorkspaceExpirationAction, type Workspace } from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { api, command } from "./api.js";
import type { Live } from "./detail.js";
import { field, h, labelsText, MiB, mibBytes, parseLabels, setError } from "./dom.js";
import { showError } from "./errors.js";


/**
 * editForms renders one small form per change into body; each is sent with
 * the revision of the workspace the page shows, so a change made meanwhile
 * by another client is refused (aborted) rather than overwritten.
 */
export function editForms(body: HTMLElement, id: string, live: Live, signal: AbortSignal): void {
  let w: Workspace | undefined;
  const memory = h("input", { id: "edit-memory", inputmode: "decimal" });
  const disk = h("input", { id: "edit-disk", inputmode: "decimal" });
  const labels = h("input", { id: "edit-labels" });
  const deadline = h("input", { id: "edit-deadline", type: "datetime-local" });
  const action = h("select", { id: "edit-action" },
    h("option", { value: String(WorkspaceExpirationAction.STOP) }, "stop"),
    h("option", { value: String(WorkspaceExpirationAction.DELETE) }, "delete"));
  let filled = false;
  live.subscribe((x) => {
    w = x;
    if (filled) return;
    filled = true;
    const r = x.spec?.resources;
    memory.value = r ? String(Number(r.memoryBytes) / MiB) : "";
    disk.value = r?.writableLayerBytes ? String(Number(r.writableLayerBytes) / MiB) : "";
    labels.value = labelsText(x.labels);
  }, signal);

  const form = (title: string, controls: HTMLElement[], run: () => Promise<unknown> | undefined, fieldId: string) => {
    const f = h("form", { class: "toolbar", "aria-label": title }, ...controls, h("button", { type: "submit", class: "small" }, title));
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      setError(fieldId, "");
      try {
        await run();
      } catch (e) {
        showError(e, [], fieldId);
      }
    });
    return f;
  };
  body.append(h("h2", null, "Change"),
    form("Set memory", [field("Memory (MiB)", memory)], () => {
      const memoryBytes = mibBytes("edit-memory", memory.value);
      return memoryBytes === undefined ? undefined : api.workspaces.updateWorkspaceMemory({
        command: command(), workspaceId: id, expectedResourcesRevision: w?.spec?.resourcesRevision ?? 0n, memoryBytes,
      });
    }, "edit-memory"),
    form("Grow disk", [field("Disk (MiB)", disk, "grows the writable layer while stopped")], () => {
      const writableLayerBytes = mibBytes("edit-disk", disk.value);
      return writableLayerBytes === undefined ? undefined : api.workspaces.resizeWorkspaceWritableLayer({
        command: command(), workspaceId: id, expectedResourcesRevision: w?.spec?.resourcesRevision ?? 0n, writableLayerBytes,
      });
    }, "edit-disk"),
    form("Set labels", [field("Labels", labels)], () => api.workspaces.updateWorkspaceLabels({
      command: command(), workspaceId: id, expectedLabelsRevision: w?.labelsRevision ?? 0n, labels: parseLabels(labels.value),
    }), "edit-labels"),
    form("Set expiration", [field("Expires at (local time)", deadline), field("Then", action)], () => api.workspaces.updateWorkspaceExpiration({
      command: command(), workspaceId: id,
      change: deadline.value
        ? { change: { case: "set", value: { deadline: timestampFromDate(new Date(deadline.value)), action: Number(action.value) } } }
        : { change: { case: "clear", value: {} } },
    }), "edit-deadline"));
}
