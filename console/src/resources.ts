// The project's other resources: Volumes, Templates, Egresses, Resolvers
// and tokens, each a list with its common actions; the actions the
// caller's role may not call are not shown.
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  ImageArchiveFormat, ImportTemplateRevisionRequestSchema, ImportTemplateRevisionResponseSchema, VolumeState, type Template,
} from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { Role } from "../../sdk/typescript/gen/kibotos/admin/v1/admin_pb.js";
import { allPages, api, apiError, command, errorText, token } from "./api.js";
import { canChangeBuiltIn, canWrite, type Caller } from "./auth.js";
import { bytes, confirmed, field, foreign, h, labelsText, mibBytes, setError, when } from "./dom.js";
import { clearErrors, showError } from "./errors.js";
import { chunks, upload } from "./upload.js";
import { upstreamsView } from "./upstreams.js";

/**
 * table renders rows of cells under headers; the last cell of a row is its
 * actions, left out (with its header) when the caller may not act.
 */
function table(label: string, headers: string[], rows: (string | Node)[][], actions = true): HTMLElement {
  if (!actions) {
    headers = headers.slice(0, -1);
    rows = rows.map((r) => r.slice(0, -1));
  }
  return h("div", { class: "scroll" }, h("table", { class: "list", "aria-label": label },
    h("thead", null, h("tr", null, ...headers.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", null, ...rows.map((r) => h("tr", null, ...r.map((c) => h("td", null, c)))))));
}

/** section renders a titled card whose list is loaded by load and reloaded after each action. */
function section(main: HTMLElement, title: string, id: string, load: (reload: () => void) => Promise<HTMLElement>, form?: (reload: () => void) => HTMLElement) {
  const slot = h("div");
  const card = h("section", { class: "card", "aria-labelledby": `${id}-title` }, h("h2", { id: `${id}-title` }, title),
    h("p", { id: `${id}-error`, class: "field-error", role: "alert" }), slot);
  const reload = () => {
    load(reload).then((el) => slot.replaceChildren(el)).catch((e) => setError(id, errorText(apiError(e))));
  };
  if (form) card.insertBefore(form(reload), slot);
  main.append(card);
  reload();
}

/**
 * remove is a confirmed button that runs run on one object, named in its
 * label ("Delete template base"), and reloads; a refusal shows in the
 * error slot of section.
 */
function remove(section: string, label: string, object: string, run: () => Promise<unknown>, reload: () => void): HTMLElement {
  return confirmed(label, object, async () => { await run(); reload(); },
    (e) => setError(section, `${label} ${object}: ${errorText(apiError(e))}`));
}

/**
 * builtIn reports whether a template is one of the deployment's own
 * (base, desktop): the API marks one by a revision of source "builtin",
 * which only the deployment imports; only an admin of the operator
 * project may change one.
 */
function builtIn(t: Template): boolean {
  return t.revisions.some((r) => r.source === "builtin");
}

/**
 * importForm imports an image archive as a template's revision (creating
 * the template when it does not exist), with the upload's progress.
 */
function importForm(reload: () => void): HTMLElement {
  const id = h("input", { id: "tpl-id", placeholder: "my-image" });
  const file = h("input", { id: "tpl-file", type: "file", accept: ".tar" });
  const format = h("select", { id: "tpl-format" },
    h("option", { value: String(ImageArchiveFormat.TARBALL) }, "docker save tarball"),
    h("option", { value: String(ImageArchiveFormat.OCI_LAYOUT_TAR) }, "OCI layout tar"));
  const setDefault = h("input", { id: "tpl-default", type: "checkbox", checked: true });
  const bar = h("progress", { id: "tpl-progress", max: "1", value: "0", hidden: true, "aria-label": "Import progress" });
  const f = h("form", { class: "toolbar", "aria-label": "Import a template revision" },
    field("Template", id), field("Image archive", file), field("Format", format),
    h("label", null, setDefault, " make it the default"), h("button", { type: "submit" }, "Import"), bar);
  f.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(["tpl-id", "tpl-file"]);
    const archive = file.files?.[0];
    if (!archive) {
      setError("tpl-file", "choose an image archive");
      return;
    }
    // A template this import creates is deleted again if the import
    // fails: a failed import leaves nothing behind.
    let created = false;
    try {
      await api.templates.createTemplate({ command: command(), templateId: id.value }).then(() => (created = true), (e) => {
        if (ConnectError.from(e).code !== Code.AlreadyExists) throw e;
      });
      const start = toBinary(ImportTemplateRevisionRequestSchema, create(ImportTemplateRevisionRequestSchema, {
        part: { case: "start", value: { command: command(), templateId: id.value, source: { case: "archive", value: Number(format.value) }, setDefault: setDefault.checked } },
      }));
      bar.hidden = false;
      bar.max = archive.size || 1;
      await upload(`${location.origin}/kibotos.ctrl.v1.TemplateService/ImportTemplateRevision`, token() ?? "",
        [start, ...chunks(archive, CHUNK_FIELD)], ImportTemplateRevisionResponseSchema, (sent) => (bar.value = sent));
      reload();
    } catch (e) {
      showError(e, [[/template_id/, "tpl-id"]], "tpl-file");
      if (created) await api.templates.deleteTemplate({ command: command(), templateId: id.value }).catch(() => undefined);
    }
  });
  return f;
}

/** CHUNK_FIELD is ImportTemplateRevisionRequest.chunk's field number. */
const CHUNK_FIELD = 2;

/** resourcesView renders the lists into main. */
export function resourcesView(main: HTMLElement, caller: Caller, signal: AbortSignal): void {
  const write = canWrite(caller);
  main.replaceChildren(h("h1", null, "Resources"));
  section(main, "Volumes", "volumes", async (reload) => {
    const volumes = await allPages((pageToken) => api.volumes.listVolumes({ pageSize: 1000, pageToken }, { signal }), (r) => r.volumes);
    return table("Volumes", ["Volume", "State", "Capacity", "Pool", "Bound to", "Labels", "Actions"],
      volumes.filter((v) => v.state !== VolumeState.DELETED).map((v) => [v.volumeId, VolumeState[v.state], bytes(v.spec?.capacityBytes ?? 0n),
        v.spec?.storagePool ?? "", v.boundWorkspaceId, labelsText(v.labels),
        remove("volumes", "Delete", `volume ${v.volumeId}`, () => api.volumes.deleteVolume({ command: command(), volumeId: v.volumeId }), reload)]), write);
  }, write ? (reload) => {
    const cap = h("input", { id: "vol-capacity", inputmode: "decimal", placeholder: "1024" });
    const f = h("form", { class: "toolbar" }, field("Capacity (MiB; empty is the pool's profile)", cap), h("button", { type: "submit" }, "Create a volume"));
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(["vol-capacity"]);
      try {
        const capacityBytes = mibBytes("vol-capacity", cap.value);
        if (capacityBytes === undefined) return;
        await api.volumes.createVolume({ command: command(), spec: { capacityBytes } });
        reload();
      } catch (e) {
        showError(e, [], "vol-capacity");
      }
    });
    return f;
  } : undefined);
  section(main, "Templates", "templates", async (reload) => {
    const templates = await allPages((pageToken) => api.templates.listTemplates({ pageSize: 1000, pageToken }, { signal }), (r) => r.templates);
    return table("Templates", ["Template", "Default revision", "Revisions", "Updated", "Actions"],
      templates.map((t) => [t.templateId, t.defaultRevision, String(t.revisions.length), when(t.updatedAt),
        builtIn(t) && !canChangeBuiltIn(caller) ? ""
          : remove("templates", "Delete", `template ${t.templateId}`, () => api.templates.deleteTemplate({ command: command(), templateId: t.templateId }), reload)]), write);
  }, write ? importForm : undefined);
  upstreamsView(main, write, signal);
  if (caller.role !== "admin") return;
  section(main, "Tokens", "tokens", async (reload) => {
    const { tokens } = await api.admin.listTokens({ projectId: caller.projectId }, { signal });
    return table("Tokens", ["Token", "Name", "Role", "Created", "Revoked", "Actions"],
      tokens.map((t) => [t.tokenId, foreign(t.name), Role[t.role].toLowerCase(), when(t.createdAt), when(t.revokedAt),
        t.revokedAt ? "" : remove("tokens", "Revoke", `token ${t.tokenId}`, () => api.admin.revokeToken({ tokenId: t.tokenId }), reload)]));
  }, (reload) => {
    const name = h("input", { id: "tok-name" });
    const role = h("select", { id: "tok-role" }, ...[Role.VIEWER, Role.EDITOR, Role.ADMIN].map((r) => h("option", { value: String(r) }, Role[r].toLowerCase())));
    const secret = h("output", { id: "tok-secret", "aria-live": "polite" });
    const f = h("form", { class: "toolbar" }, field("Name", name), field("Role", role), h("button", { type: "submit" }, "Create a token"), secret);
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(["tok-name"]);
      try {
        const r = await api.admin.createToken({ projectId: caller.projectId, role: Number(role.value), name: name.value });
        secret.textContent = `Secret (shown once): ${r.secret}`;
        reload();
      } catch (e) {
        showError(e, [], "tok-name");
      }
    });
    return f;
  });
}
