// Small DOM helpers: element construction, field errors, formatting.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { apiError, errorText } from "./api.js";
import { visible } from "./text.js";

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | undefined>;

/** h creates an element: attributes ("on…" are listeners, booleans toggle) and children. */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs?: Attrs | null, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === false) continue;
    if (typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, ...children);
  return el;
}

/** append adds children, skipping empty ones. */
export function append(el: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
}

/** field is a labelled input (or select/textarea) with an error slot after it, described by it. */
export function field(label: string, control: HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement, hint?: string): HTMLElement {
  const id = control.id;
  const err = h("p", { id: `${id}-error`, class: "field-error", role: "alert" });
  const described = [hint ? `${id}-hint` : "", `${id}-error`].filter(Boolean).join(" ");
  control.setAttribute("aria-describedby", described);
  return h("div", { class: "field" },
    h("label", { for: id }, label), control,
    hint ? h("small", { id: `${id}-hint` }, hint) : null, err);
}

/** setError shows msg in the error slot of the control with this id (clears it when empty). */
export function setError(id: string, msg: string): void {
  const slot = document.getElementById(`${id}-error`);
  const control = document.getElementById(id);
  if (slot) slot.textContent = msg;
  if (control) {
    if (msg) control.setAttribute("aria-invalid", "true");
    else control.removeAttribute("aria-invalid");
  }
}

/**
 * foreign is text the console did not choose, made visible and isolated
 * (<bdi>) from what is around it on the line.
 */
export function foreign(text: string): HTMLElement {
  return h("bdi", { class: "foreign" }, visible(text));
}

/** bytes formats a byte count with binary units. */
export function bytes(n: bigint | number): string {
  let v = Number(n);
  for (const u of ["B", "KiB", "MiB", "GiB"]) {
    if (v < 1024 || u === "GiB") return `${Number.isInteger(v) ? v : v.toFixed(1)} ${u}`;
    v /= 1024;
  }
  return `${v} B`;
}

/** age formats how long ago a date was, coarsely. */
export function age(d: Date | undefined, now = Date.now()): string {
  if (!d) return "";
  const s = Math.max(0, Math.floor((now - d.getTime()) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** when formats a time as UTC "YYYY-MM-DD hh:mm:ss" (empty when absent). */
export function when(t: Timestamp | undefined): string {
  return t ? timestampDate(t).toISOString().replace("T", " ").slice(0, 19) : "";
}

/** labelsText formats labels as k=v, comma separated. */
export function labelsText(labels: Record<string, string>): string {
  return Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(", ");
}

/** parseLabels reads "k=v, k2=v2" (empty gives none); the server checks the rules. */
export function parseLabels(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of text.split(",")) {
    const p = part.trim();
    if (!p) continue;
    const i = p.indexOf("=");
    out[i < 0 ? p : p.slice(0, i).trim()] = i < 0 ? "" : p.slice(i + 1).trim();
  }
  return out;
}

/** MiB is a mebibyte. */
export const MiB = 1 << 20;

/**
 * mib reads a field of MiB as bytes, decimals kept (the server judges
 * whole MiB and says so); empty is 0, anything but a number ≥ 0 undefined.
 */
export function mib(text: string): bigint | undefined {
  const n = Number(text.trim() || "0");
  return Number.isFinite(n) && n >= 0 ? BigInt(Math.round(n * MiB)) : undefined;
}

/** mibBytes reads a field of MiB, or says next to it that it is not a number. */
export function mibBytes(id: string, text: string): bigint | undefined {
  const b = mib(text);
  if (b === undefined) setError(id, "enter a number of MiB");
  return b;
}

/**
 * wholeNumber reads a field of a whole number ≥ 0 (empty is 0), or says
 * next to it that it is not one.
 */
export function wholeNumber(id: string, text: string): number | undefined {
  const n = Number(text.trim() || "0");
  if (Number.isSafeInteger(n) && n >= 0) return n;
  setError(id, "enter a whole number");
  return undefined;
}

/** lines splits a textarea's text into its non-empty trimmed lines. */
export function lines(text: string): string[] {
  return text.split("\n").map((l) => l.trim()).filter(Boolean);
}

/** CONFIRM_MS is how long a confirmed button waits for its second press. */
const CONFIRM_MS = 5000;

/**
 * confirmed is a button that asks once more before it runs: the first
 * press turns it into "Confirm …", the second runs (focus stays on it).
 */
export function confirmed(label: string, id: string, run: () => Promise<unknown>, onError?: (e: unknown) => void): HTMLButtonElement {
  const b = h("button", { type: "button", class: "small danger", "aria-label": `${label} ${id}` }, label);
  let disarm: ReturnType<typeof setTimeout> | undefined;
  const reset = () => {
    clearTimeout(disarm);
    delete b.dataset.armed;
    b.textContent = label;
    b.setAttribute("aria-label", `${label} ${id}`);
  };
  b.addEventListener("click", async () => {
    if (!b.dataset.armed) {
      b.dataset.armed = "1";
      b.textContent = `Confirm ${label.toLowerCase()}`;
      b.setAttribute("aria-label", `Confirm ${label.toLowerCase()} ${id}`);
      disarm = setTimeout(reset, CONFIRM_MS); // a press much later is a first press again
      return;
    }
    reset();
    try {
      await run();
    } catch (e) {
      if (onError) onError(e);
      else setError("ws-create", `${label} ${id}: ${errorText(apiError(e))}`);
    }
  });
  return b;
}
