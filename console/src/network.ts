// A workspace's network policy: the stored revision and what the host
// applied, Egress and Resolver observations, and an edit that is a CAS on
// the revision the form was loaded at. A stale edit shows the conflict and
// the current policy, and stores nothing.
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ConnectError, Code } from "@connectrpc/connect";
import {
  EgressObservationKind, NetworkPolicyMode, ResolverObservationKind, type NetworkPolicy,
} from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { api, command } from "./api.js";
import type { Live } from "./detail.js";
import { field, h, lines, setError, wholeNumber } from "./dom.js";
import { clearErrors, showError, type FieldMap } from "./errors.js";
import { visible } from "./text.js";

const fields: FieldMap = [
  [/network_policy\.allow|^allow/, "net-allow"],
  [/network_policy\.deny|^deny/, "net-deny"],
  [/drain_seconds/, "net-drain"],
  [/DENY_ALL accepts|mode/, "net-mode"],
];

/** policyText is a policy in a few lines. */
export function policyText(p: NetworkPolicy | undefined): string {
  if (!p) return "";
  const out = [`revision ${p.revision}: ${NetworkPolicyMode[p.mode]}`];
  if (p.allow.length) out.push(`allow ${p.allow.join(", ")}`);
  if (p.deny.length) out.push(`deny ${p.deny.join(", ")}`);
  for (const e of p.egresses) out.push(`egress ${e.egressId} for ${e.destinations.join(", ")}`);
  for (const r of p.resolvers) out.push(`resolver ${r.resolverId}`);
  return out.join("\n");
}

/** networkView renders the policy view and, when write, its editor of the workspace into body. */
export function networkView(body: HTMLElement, workspaceId: string, live: Live, write: boolean, signal: AbortSignal): void {
  const status = h("dl", { id: "net-status", class: "facts", "aria-live": "polite" });
  const mode = h("select", { id: "net-mode" },
    h("option", { value: String(NetworkPolicyMode.DENY_ALL) }, "deny all"),
    h("option", { value: String(NetworkPolicyMode.PUBLIC_INTERNET) }, "public internet"));
  const allow = h("textarea", { id: "net-allow", rows: 3, placeholder: "one CIDR a line, e.g. 203.0.113.0/24" });
  const deny = h("textarea", { id: "net-deny", rows: 3 });
  const drain = h("input", { id: "net-drain", inputmode: "numeric", placeholder: "600" });
  const upstreams = h("p", { id: "net-upstreams" });
  const conflict = h("div", { id: "net-conflict", role: "alert" });
  const save = h("button", { type: "submit" }, "Save");
  const form = h("form", { class: "edit", "aria-labelledby": "net-edit-title" },
    h("h3", { id: "net-edit-title" }, "Edit the policy"),
    field("Mode", mode), field("Allow (CIDRs)", allow), field("Deny (CIDRs)", deny),
    field("Drain seconds", drain, "how long connections moved off a path keep running; empty is 600"), upstreams,
    save, h("p", { id: "net-form-error", class: "field-error", role: "alert" }), conflict);
  body.replaceChildren(h("h2", null, "Network policy"), status, write ? form : "");

  let loaded: NetworkPolicy | undefined;
  function load(p: NetworkPolicy | undefined) {
    loaded = p;
    mode.value = String(p?.mode ?? NetworkPolicyMode.DENY_ALL);
    allow.value = (p?.allow ?? []).join("\n");
    deny.value = (p?.deny ?? []).join("\n");
    upstreams.textContent = p && (p.egresses.length || p.resolvers.length)
      ? `Kept as they are: ${[...p.egresses.map((e) => `egress ${e.egressId}`), ...p.resolvers.map((r) => `resolver ${r.resolverId}`)].join(", ")}`
      : "";
    form.dataset.revision = String(p?.revision ?? 0);
  }
  live.subscribe((w) => {
    if (loaded === undefined) load(w.spec?.networkPolicy);
    const s = w.networkPolicyStatus;
    const facts: [string, string][] = [
      ["Stored", policyText(w.spec?.networkPolicy)],
      ["Applied revision", String(s?.appliedRevision ?? 0)],
      ["Applied at", s?.appliedAt ? timestampDate(s.appliedAt).toISOString() : ""],
      ["Draining revision", s?.drainingRevision ? String(s.drainingRevision) : ""],
      ...w.egressObservations.map((o): [string, string] => [`Egress ${o.egressId}`, `${EgressObservationKind[o.kind]}: ${visible(o.error, false)}`]),
      ...w.resolverObservations.map((o): [string, string] => [`Resolver ${o.resolverId}`, `${ResolverObservationKind[o.kind]}: ${visible(o.error, false)}`]),
    ];
    status.replaceChildren(...facts.filter(([, v]) => v).flatMap(([k, v]) => [h("dt", null, k), h("dd", { "data-fact": k }, v)]));
  }, signal);

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(["net-mode", "net-allow", "net-deny", "net-drain", "net-form"]);
    conflict.replaceChildren();
    const expected = loaded?.revision ?? 0n;
    const drainSeconds = drain.value.trim() === "" ? undefined : wholeNumber("net-drain", drain.value);
    if (drainSeconds === undefined && drain.value.trim() !== "") return;
    try {
      const r = await api.workspaces.updateWorkspaceNetworkPolicy({
        command: command(), workspaceId, expectedRevision: expected,
        policy: {
          mode: Number(mode.value), allow: lines(allow.value), deny: lines(deny.value),
          egresses: loaded?.egresses ?? [], resolvers: loaded?.resolvers ?? [],
        },
        drainSeconds,
      });
      // The form takes the stored revision; the status follows the watch,
      // whose later states (the host applying it) a read here could undo.
      load(r.workspace?.spec?.networkPolicy);
    } catch (e) {
      // A stale edit: read the current policy first, so that the conflict
      // and the policy show together.
      const current = ConnectError.from(e).code === Code.Aborted
        ? await api.workspaces.getWorkspace({ workspaceId }).then((r) => r.workspace?.spec?.networkPolicy, () => undefined)
        : undefined;
      showError(e, fields, "net-form");
      if (current) {
        const reload = h("button", { type: "button", class: "small", onclick: () => { load(current); conflict.replaceChildren(); setError("net-form", ""); } },
          "Edit the current policy");
        conflict.replaceChildren(
          h("p", null, `Conflict: this edit was made on revision ${expected}, and the policy is now at revision ${current.revision}. Nothing was changed.`),
          h("pre", { id: "net-current" }, policyText(current)), reload);
      }
    }
  });
}
