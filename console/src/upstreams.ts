// Egresses and Resolvers: each a list and one form that creates or, loaded
// from a row, edits (a CAS on the revision it was loaded at; a stale edit
// shows the conflict and the current spec, and stores nothing). The spec
// and its labels are separate CAS writes, as in the API.
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Egress, EgressSpec, Resolver, ResolverSpec } from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { allPages, api, apiError, command, errorText } from "./api.js";
import { confirmed, field, h, labelsText, parseLabels, setError, when, wholeNumber } from "./dom.js";
import { clearErrors, showError, type FieldMap } from "./errors.js";
import { visible } from "./text.js";

/** specKey is a spec's content as text, to tell whether a form changed it. */
function specKey(spec: unknown): string {
  return JSON.stringify(spec, (_, v) => (typeof v === "bigint" ? v.toString() : v instanceof Uint8Array ? Array.from(v) : v));
}

/** Upstream is what the form needs of an Egress or a Resolver. */
interface Upstream<S> {
  id: string;
  spec?: S;
  revision: bigint;
  labels: Record<string, string>;
  labelsRevision: bigint;
  updatedAt?: Timestamp;
}

/** Kind is one kind of upstream: its calls, its spec's controls and how its spec reads. */
interface Kind<S> {
  noun: string; // "egress"
  title: string; // "Egresses"
  prefix: string; // the id prefix of the form's controls
  list(signal: AbortSignal): Promise<Upstream<S>[]>;
  get(id: string): Promise<Upstream<S> | undefined>;
  create(spec: S, labels: Record<string, string>): Promise<unknown>;
  update(id: string, expectedRevision: bigint, spec: S, drainSeconds: number | undefined): Promise<unknown>;
  updateLabels(id: string, expectedLabelsRevision: bigint, labels: Record<string, string>): Promise<unknown>;
  remove(id: string): Promise<unknown>;
  /** controls builds the spec's fields, which read and fill the spec. */
  controls(): { fields: HTMLElement[]; read(): S; fill(s: S | undefined): void; ids: string[] };
  /** errors maps the server's messages to the spec's controls. */
  errors: FieldMap;
  describe(s: S | undefined): string;
}

/**
 * upstreamSection renders a kind's card into main: the form (create, or
 * edit once a row's Edit loads it) when canWrite, and the list.
 */
function upstreamSection<S>(main: HTMLElement, k: Kind<S>, canWrite: boolean, signal: AbortSignal): void {
  const p = k.prefix;
  const status = h("p", { id: `${p}-error`, class: "field-error", role: "alert" });
  const slot = h("div");
  const card = h("section", { class: "card", "aria-labelledby": `${p}-title` }, h("h2", { id: `${p}-title` }, k.title), status);
  main.append(card);

  let editing: Upstream<S> | undefined;
  const reload = () => {
    k.list(signal).then((items) => slot.replaceChildren(table(items))).catch((e) => {
      if (!signal.aborted) status.textContent = errorText(apiError(e));
    });
  };

  let load: (u: Upstream<S> | undefined) => void = () => {};
  if (canWrite) {
    const c = k.controls();
    const labels = h("input", { id: `${p}-labels`, placeholder: "team=a" });
    const drain = h("input", { id: `${p}-drain`, inputmode: "numeric", placeholder: "600" });
    const drainField = field("Drain seconds", drain, "how long connections through the previous revision keep running; empty is 600");
    const heading = h("h3", { id: `${p}-form-title` });
    const submit = h("button", { type: "submit" });
    const cancel = h("button", { type: "button", class: "small", onclick: () => load(undefined) }, "Cancel");
    const conflict = h("div", { id: `${p}-conflict`, role: "alert" });
    const form = h("form", { class: "upstream", "aria-labelledby": `${p}-form-title` },
      heading, h("div", { class: "grid" }, ...c.fields, field("Labels", labels), drainField),
      h("div", { class: "toolbar" }, submit, cancel),
      h("p", { id: `${p}-form-error`, class: "field-error", role: "alert" }), conflict);
    const ids = [...c.ids, `${p}-labels`, `${p}-drain`, `${p}-form`];
    const errors: FieldMap = [...k.errors, [/label/, `${p}-labels`], [/drain_seconds/, `${p}-drain`]];
    // filled is the spec as the form holds it once loaded: a save sends
    // the spec only when the form changed it (a stored password the form
    // cannot show would otherwise be sent empty).
    let filled = "";
    load = (u) => {
      editing = u;
      clearErrors(ids);
      conflict.replaceChildren();
      c.fill(u?.spec);
      filled = specKey(c.read());
      labels.value = u ? labelsText(u.labels) : "";
      drain.value = "";
      drainField.hidden = !u;
      cancel.hidden = !u;
      heading.textContent = u ? `Edit ${k.noun} ${u.id} (revision ${u.revision})` : `Create ${k.noun === "egress" ? "an" : "a"} ${k.noun}`;
      submit.textContent = u ? "Save" : "Create";
      form.dataset.editing = u?.id ?? "";
      form.dataset.revision = String(u?.revision ?? "");
    };
    load(undefined);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(ids);
      conflict.replaceChildren();
      const u = editing;
      const newLabels = parseLabels(labels.value);
      try {
        if (!u) {
          await k.create(c.read(), newLabels);
        } else {
          const drainSeconds = drain.value.trim() === "" ? undefined : wholeNumber(`${p}-drain`, drain.value);
          if (drainSeconds === undefined && drain.value.trim() !== "") return;
          // The labels go first: refused, they leave the spec unchanged
          // too; stored, the form follows their new revision.
          if (labelsText(newLabels) !== labelsText(u.labels)) {
            await k.updateLabels(u.id, u.labelsRevision, newLabels);
            const now = await k.get(u.id);
            if (now) editing = { ...u, labels: now.labels, labelsRevision: now.labelsRevision };
          }
          if (specKey(c.read()) !== filled || drainSeconds !== undefined) await k.update(u.id, u.revision, c.read(), drainSeconds);
        }
        load(undefined);
        reload();
      } catch (e) {
        // A stale edit: the current one read first, so that the conflict
        // and it show together.
        const current = u && ConnectError.from(e).code === Code.Aborted ? await k.get(u.id).catch(() => undefined) : undefined;
        showError(e, errors, `${p}-form`);
        if (!current) return;
        reload();
        conflict.replaceChildren(
          h("p", null, `Conflict: this edit was made on revision ${u!.revision}, and the ${k.noun} is now at revision ${current.revision}. Nothing was changed.`),
          h("pre", { id: `${p}-current` }, `revision ${current.revision}: ${k.describe(current.spec)}`),
          h("button", { type: "button", class: "small", onclick: () => load(current) }, `Edit the current ${k.noun}`));
      }
    });
    card.append(form);
  }
  card.append(slot);

  function table(items: Upstream<S>[]): HTMLElement {
    const headers = [k.noun[0].toUpperCase() + k.noun.slice(1), "Revision", "Spec", "Labels", "Updated", ...(canWrite ? ["Actions"] : [])];
    return h("div", { class: "scroll" }, h("table", { class: "list", "aria-label": k.title },
      h("thead", null, h("tr", null, ...headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", null, ...items.map((u) => h("tr", { "data-id": u.id },
        h("td", null, u.id), h("td", null, String(u.revision)), h("td", null, k.describe(u.spec)),
        h("td", null, labelsText(u.labels)), h("td", null, when(u.updatedAt)),
        canWrite ? h("td", { class: "actions" },
          h("button", { type: "button", class: "small", "aria-label": `Edit ${u.id}`, onclick: () => {
            load(u);
            document.getElementById(`${p}-form-title`)?.scrollIntoView();
          } }, "Edit"),
          confirmed("Delete", u.id, async () => { await k.remove(u.id); reload(); }, (e) => setError(p, errorText(apiError(e)))))
          : null)))));
  }
  reload();
}

/** tlsControls are the server name and CA certificate fields of a TLS setting. */
function tlsControls(p: string) {
  const serverName = h("input", { id: `${p}-server-name`, placeholder: "empty is the address's host" });
  const caCert = h("textarea", { id: `${p}-ca-cert`, rows: 3, placeholder: "-----BEGIN CERTIFICATE-----" });
  return {
    serverName, caCert,
    fields: [field("TLS server name", serverName), field("CA certificate (PEM)", caCert, "empty trusts the system's roots")],
  };
}

const egressKind: Kind<EgressSpec> = {
  noun: "egress", title: "Egresses", prefix: "eg",
  list: async (signal) => (await allPages((pageToken) => api.egresses.listEgresses({ pageSize: 1000, pageToken }, { signal }), (r) => r.egresses)).map(egress),
  get: async (id) => {
    const e = (await api.egresses.getEgress({ egressId: id })).egress;
    return e && egress(e);
  },
  create: (spec, labels) => api.egresses.createEgress({ command: command(), spec, labels }),
  update: (egressId, expectedRevision, spec, drainSeconds) =>
    api.egresses.updateEgress({ command: command(), egressId, expectedRevision, spec, drainSeconds }),
  updateLabels: (egressId, expectedLabelsRevision, labels) =>
    api.egresses.updateEgressLabels({ command: command(), egressId, expectedLabelsRevision, labels }),
  remove: (egressId) => api.egresses.deleteEgress({ command: command(), egressId }),
  controls() {
    const address = h("input", { id: "eg-address", placeholder: "proxy.example.com:1080", required: true });
    const username = h("input", { id: "eg-username", autocomplete: "off" });
    const password = h("input", { id: "eg-password", type: "password", autocomplete: "new-password" });
    const tls = h("input", { id: "eg-tls", type: "checkbox" });
    const udp = h("input", { id: "eg-udp", type: "checkbox" });
    const t = tlsControls("eg");
    const tlsFields = t.fields.map((f) => f);
    const showTls = () => tlsFields.forEach((f) => (f.hidden = !tls.checked));
    tls.addEventListener("change", showTls);
    const passwordField = field("Password", password, "write-only: never read back, so an edit sends it again");
    return {
      fields: [
        field("SOCKS5 address (host:port)", address),
        field("Username", username, "optional; given with a password (RFC 1929)"), passwordField,
        h("div", { class: "field" }, h("label", null, tls, " TLS to the endpoint")),
        ...tlsFields,
        h("div", { class: "field" }, h("label", null, udp, " UDP enabled (udp Resolvers through it)")),
      ],
      ids: ["eg-address", "eg-username", "eg-password", "eg-tls", "eg-server-name", "eg-ca-cert", "eg-udp"],
      read: () => ({
        protocol: {
          case: "socks5", value: {
            address: address.value.trim(), username: username.value, password: password.value,
            tls: tls.checked ? { serverName: t.serverName.value.trim(), caCert: t.caCert.value } : undefined,
          },
        },
        udpEnabled: udp.checked,
      }) as EgressSpec,
      fill(s) {
        const v = s?.protocol.case === "socks5" ? s.protocol.value : undefined;
        address.value = v?.address ?? "";
        username.value = v?.username ?? "";
        password.value = "";
        tls.checked = !!v?.tls;
        t.serverName.value = v?.tls?.serverName ?? "";
        t.caCert.value = v?.tls?.caCert ?? "";
        udp.checked = !!s?.udpEnabled;
        showTls();
      },
    };
  },
  errors: [
    [/socks5\.address/, "eg-address"],
    [/username and password|socks5\.username/, "eg-username"],
    [/socks5\.password/, "eg-password"],
    [/server_name/, "eg-server-name"],
    [/ca_cert/, "eg-ca-cert"],
    [/udp/i, "eg-udp"],
  ],
  describe(s) {
    const v = s?.protocol.case === "socks5" ? s.protocol.value : undefined;
    if (!v) return "";
    return [`socks5 ${v.address}`, v.username && `user ${visible(v.username)}`, v.tls && `tls${v.tls.serverName ? ` ${v.tls.serverName}` : ""}${v.tls.caCert ? " (own CA)" : ""}`,
      s?.udpEnabled && "udp"].filter(Boolean).join(", ");
  },
};

function egress(e: Egress): Upstream<EgressSpec> {
  return { id: e.egressId, spec: e.spec, revision: e.revision, labels: e.labels, labelsRevision: e.labelsRevision, updatedAt: e.updatedAt };
}

function resolver(r: Resolver): Upstream<ResolverSpec> {
  return { id: r.resolverId, spec: r.spec, revision: r.revision, labels: r.labels, labelsRevision: r.labelsRevision, updatedAt: r.updatedAt };
}

type ResolverProtocol = "udp" | "tcp" | "tls" | "https";

const resolverKind: Kind<ResolverSpec> = {
  noun: "resolver", title: "Resolvers", prefix: "rs",
  list: async (signal) => (await allPages((pageToken) => api.resolvers.listResolvers({ pageSize: 1000, pageToken }, { signal }), (r) => r.resolvers)).map(resolver),
  get: async (id) => {
    const r = (await api.resolvers.getResolver({ resolverId: id })).resolver;
    return r && resolver(r);
  },
  create: (spec, labels) => api.resolvers.createResolver({ command: command(), spec, labels }),
  update: (resolverId, expectedRevision, spec, drainSeconds) =>
    api.resolvers.updateResolver({ command: command(), resolverId, expectedRevision, spec, drainSeconds }),
  updateLabels: (resolverId, expectedLabelsRevision, labels) =>
    api.resolvers.updateResolverLabels({ command: command(), resolverId, expectedLabelsRevision, labels }),
  remove: (resolverId) => api.resolvers.deleteResolver({ command: command(), resolverId }),
  controls() {
    const protocol = h("select", { id: "rs-protocol" },
      h("option", { value: "udp" }, "DNS over UDP"), h("option", { value: "tcp" }, "DNS over TCP"),
      h("option", { value: "tls" }, "DNS over TLS"), h("option", { value: "https" }, "DNS over HTTPS"));
    const address = h("input", { id: "rs-address", placeholder: "192.0.2.53:53" });
    const url = h("input", { id: "rs-url", placeholder: "https://dns.example.com/dns-query" });
    const t = tlsControls("rs");
    const addressField = field("Address (host:port)", address);
    const urlField = field("URL", url);
    const show = () => {
      const v = protocol.value as ResolverProtocol;
      addressField.hidden = v === "https";
      urlField.hidden = v !== "https";
      t.fields.forEach((f) => (f.hidden = v === "udp" || v === "tcp"));
    };
    protocol.addEventListener("change", show);
    return {
      fields: [field("Protocol", protocol), addressField, urlField, ...t.fields],
      ids: ["rs-protocol", "rs-address", "rs-url", "rs-server-name", "rs-ca-cert"],
      read(): ResolverSpec {
        const tlsPart = { serverName: t.serverName.value.trim(), caCert: t.caCert.value };
        const v = protocol.value as ResolverProtocol;
        const value = v === "https" ? { url: url.value.trim(), ...tlsPart }
          : v === "tls" ? { address: address.value.trim(), ...tlsPart } : { address: address.value.trim() };
        return { protocol: { case: v, value } } as ResolverSpec;
      },
      fill(s) {
        const pr = s?.protocol;
        protocol.value = pr?.case ?? "udp";
        address.value = pr?.case && pr.case !== "https" ? pr.value.address : "";
        url.value = pr?.case === "https" ? pr.value.url : "";
        t.serverName.value = pr?.case === "tls" || pr?.case === "https" ? pr.value.serverName : "";
        t.caCert.value = pr?.case === "tls" || pr?.case === "https" ? pr.value.caCert : "";
        show();
      },
    };
  },
  errors: [
    [/\.address/, "rs-address"],
    [/\.url/, "rs-url"],
    [/server_name/, "rs-server-name"],
    [/ca_cert/, "rs-ca-cert"],
    [/protocol/, "rs-protocol"],
  ],
  describe(s) {
    const pr = s?.protocol;
    if (!pr?.case) return "";
    const where = pr.case === "https" ? pr.value.url : pr.value.address;
    const tls = pr.case === "tls" || pr.case === "https" ? pr.value : undefined;
    return [`${pr.case} ${visible(where)}`, tls?.serverName && `server name ${tls.serverName}`, tls?.caCert && "own CA"].filter(Boolean).join(", ");
  },
};

/** upstreamsView renders the Egresses' and the Resolvers' cards into main. */
export function upstreamsView(main: HTMLElement, canWrite: boolean, signal: AbortSignal): void {
  upstreamSection(main, egressKind, canWrite, signal);
  upstreamSection(main, resolverKind, canWrite, signal);
}
