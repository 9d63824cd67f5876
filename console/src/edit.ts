// Changes to a workspace from its overview: memory, writable layer and
// labels (each a CAS on the revision the page last saw) and expiration.
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { RetentionTierKind, WorkspaceExpirationAction, type Workspace } from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { api, command } from "./api.js";
import type { Live } from "./detail.js";
import { field, h, labelsText, MiB, mibBytes, parseLabels, setError } from "./dom.js";
import { showError } from "./errors.js";


/**
 * tracked is a field that shows a value of the workspace with the revision
 * it has there: it follows the workspace until the user edits it, and a
 * change is sent with the revision of what the field showed, so one made
 * meanwhile by another client is refused (aborted) rather than
 * overwritten.
 */
class Tracked {
  private shown = "";
  revision = 0n;
  constructor(readonly input: HTMLInputElement) {}
  /** show puts text of revision in the field, unless the user changed what it showed. */
  show(text: string, revision: bigint): void {
    if (this.input.value !== this.shown) return;
    this.input.value = this.shown = text;
    this.revision = revision;
  }
  /** sent marks the field's text as stored: the workspace's next news shows in it. */
  sent(): void {
    this.shown = this.input.value;
  }
}

/** diskMiB is the capacity of the workspace's writable layer in MiB: as asked, or as its host made it. */
function diskMiB(x: Workspace): string {
  const asked = x.spec?.resources?.writableLayerBytes ?? 0n;
  const made = x.retentionTiers.find((t) => t.kind === RetentionTierKind.BEST_EFFORT)?.capacityBytes ?? 0n;
  const b = asked || made;
  return b ? String(Number(b) / MiB) : "";
}

/**
 * editForms renders one small form per change into body; each is sent with
 * the revision its field showed (see Tracked).
 */
export function editForms(body: HTMLElement, id: string, live: Live, signal: AbortSignal): void {
  const memory = new Tracked(h("input", { id: "edit-memory", inputmode: "decimal" }));
  const disk = new Tracked(h("input", { id: "edit-disk", inputmode: "decimal" }));
  const labels = new Tracked(h("input", { id: "edit-labels" }));
  const deadline = h("input", { id: "edit-deadline", type: "datetime-local" });
  const action = h("select", { id: "edit-action" },
    h("option", { value: String(WorkspaceExpirationAction.STOP) }, "stop"),
    h("option", { value: String(WorkspaceExpirationAction.DELETE) }, "delete"));
  live.subscribe((x) => {
    const r = x.spec?.resources;
    const rev = x.spec?.resourcesRevision ?? 0n;
    memory.show(r ? String(Number(r.memoryBytes) / MiB) : "", rev);
    disk.show(diskMiB(x), rev);
    labels.show(labelsText(x.labels), x.labelsRevision);
  }, signal);
  const fieldIds = ["edit-memory", "edit-disk", "edit-labels", "edit-deadline"];

  const form = (title: string, controls: HTMLElement[], run: () => Promise<unknown> | undefined, fieldId: string, tracked?: Tracked) => {
    const f = h("form", { class: "toolbar", "aria-label": title }, ...controls, h("button", { type: "submit", class: "small" }, title));
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      for (const other of fieldIds) setError(other, "");
      try {
        if ((await run()) !== undefined) tracked?.sent();
      } catch (e) {
        showError(e, [], fieldId);
      }
    });
    return f;
  };
  body.append(h("h2", null, "Change"),
    form("Set memory", [field("Memory (MiB)", memory.input)], () => {
      const memoryBytes = mibBytes("edit-memory", memory.input.value);
      return memoryBytes === undefined ? undefined : api.workspaces.updateWorkspaceMemory({
        command: command(), workspaceId: id, expectedResourcesRevision: memory.revision, memoryBytes,
      });
    }, "edit-memory", memory),
    form("Grow disk", [field("Disk (MiB)", disk.input, "grows the writable layer while stopped")], () => {
      const writableLayerBytes = mibBytes("edit-disk", disk.input.value);
      return writableLayerBytes === undefined ? undefined : api.workspaces.resizeWorkspaceWritableLayer({
        command: command(), workspaceId: id, expectedResourcesRevision: disk.revision, writableLayerBytes,
      });
    }, "edit-disk", disk),
    form("Set labels", [field("Labels", labels.input)], () => api.workspaces.updateWorkspaceLabels({
      command: command(), workspaceId: id, expectedLabelsRevision: labels.revision, labels: parseLabels(labels.input.value),
    }), "edit-labels", labels),
    form("Set expiration", [field("Expires at (local time)", deadline), field("Then", action)], () => api.workspaces.updateWorkspaceExpiration({
      command: command(), workspaceId: id,
      change: deadline.value
        ? { change: { case: "set", value: { deadline: timestampFromDate(new Date(deadline.value)), action: Number(action.value) } } }
        : { change: { case: "clear", value: {} } },
    }), "edit-deadline"));
}
