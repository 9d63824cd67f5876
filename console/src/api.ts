// The API from the browser: Connect over fetch (connect-web) on this
// page's origin, with the signed-in token as a bearer token; data-plane
// clients at a session's endpoint; errors as the API gives them.
import { createClient, ConnectError, Code, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  ErrorDetailSchema, FailureReason, FailureStage, WorkspaceService, TemplateService, VolumeService, SessionService,
  EgressService, ResolverService,
} from "../../sdk/typescript/gen/kibotos/ctrl/v1/ctrl_pb.js";
import { AdminService } from "../../sdk/typescript/gen/kibotos/admin/v1/admin_pb.js";
import { FileService, ProcessService } from "../../sdk/typescript/gen/kibotos/data/v1/data_pb.js";
import { boundedFetch, maxDataPlaneMessage } from "../../sdk/typescript/src/bounded.js";
import { visible } from "./text.js";

const TOKEN_KEY = "kibotos.token";

/** token is the signed-in API token, kept in this tab's session storage only. */
export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(t: string | null): void {
  if (t === null) sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, t);
}

function bearer(get: () => string | null): Interceptor {
  return (next) => (req) => {
    const t = get();
    if (t) req.header.set("Authorization", `Bearer ${t}`);
    return next(req);
  };
}

/** transport calls baseUrl with get's token, through fetch when given. */
function transport(baseUrl: string, get: () => string | null, fetch?: typeof globalThis.fetch, ...more: Interceptor[]): Transport {
  return createConnectTransport({ baseUrl, useBinaryFormat: true, interceptors: [bearer(get), ...more], fetch });
}

/** TOKEN_REFUSED is the event the window gets when the control plane refused the signed-in token. */
export const TOKEN_REFUSED = "kibotos:token-refused";

/**
 * refusedToken tells the page when the control plane refuses the token a
 * call carried (revoked, or the project deleted): every later call would
 * be refused too. A stream's refusal may come as its end, after messages
 * (a watch open when the token was revoked), so its messages are followed
 * too.
 */
const refusedToken: Interceptor = (next) => async (req) => {
  const refused = (e: unknown) => {
    const err = ConnectError.from(e);
    if (err.code === Code.Unauthenticated && req.header.has("Authorization")) {
      window.dispatchEvent(new CustomEvent(TOKEN_REFUSED, { detail: err.rawMessage }));
    }
  };
  try {
    const res = await next(req);
    if (!res.stream) return res;
    const messages = res.message;
    async function* followed() {
      try {
        yield* messages;
      } catch (e) {
        refused(e);
        throw e;
      }
    }
    return { ...res, message: followed() };
  } catch (e) {
    refused(e);
    throw e;
  }
};

const ctrl = transport(location.origin, token, undefined, refusedToken);

/** The control plane's clients. */
export const api = {
  workspaces: createClient(WorkspaceService, ctrl),
  templates: createClient(TemplateService, ctrl),
  volumes: createClient(VolumeService, ctrl),
  sessions: createClient(SessionService, ctrl),
  egresses: createClient(EgressService, ctrl),
  resolvers: createClient(ResolverService, ctrl),
  admin: createClient(AdminService, ctrl),
};

/** command returns a new command ID (a random UUID; crypto.randomUUID needs a secure context). */
/**
 * allPages reads every page of a List method: a page may hold fewer
 * objects than it asked for (the server ends one at 4 MiB), so one page of
 * 1000 is not the whole list.
 */
export async function allPages<R extends { nextPageToken: string }, T>(page: (pageToken: string) => Promise<R>, items: (r: R) => T[]): Promise<T[]> {
  const all: T[] = [];
  let pageToken = "";
  do {
    const r = await page(pageToken);
    all.push(...items(r));
    pageToken = r.nextPageToken;
  } while (pageToken);
  return all;
}

export function command(): { commandId: string } {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const x = [...b].map((v) => v.toString(16).padStart(2, "0")).join("");
  return { commandId: `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}` };
}

/** DataPlane is a session of one workspace and the clients that use it. */
export interface DataPlane {
  endpoint: string;
  token: string;
  proc: Client<typeof ProcessService>;
  files: Client<typeof FileService>;
}

const planes = new Map<string, { plane: Promise<DataPlane>; expires: number }>();

/** dataPlane returns a session of the workspace, issued once and renewed a minute before it expires. */
export function dataPlane(workspaceId: string, fresh = false): Promise<DataPlane> {
  const cached = planes.get(workspaceId);
  if (!fresh && cached && cached.expires - Date.now() > 60_000) return cached.plane;
  const entry = { expires: Date.now() + 3_600_000, plane: Promise.resolve(null as unknown as DataPlane) };
  entry.plane = api.sessions.issueSession({ workspaceId }).then((s) => {
    if (s.expiresAt) entry.expires = timestampDate(s.expiresAt).getTime();
    // A guest shapes the data plane's answers: none is read over the SDK's bound.
    const t = transport(s.endpoint, () => s.token, boundedFetch(maxDataPlaneMessage));
    return { endpoint: s.endpoint, token: s.token, proc: createClient(ProcessService, t), files: createClient(FileService, t) };
  });
  entry.plane.catch(() => planes.delete(workspaceId));
  planes.set(workspaceId, entry);
  return entry.plane;
}

/** withPlane runs a data-plane call, with a new session once more when the data plane refuses the session. */
export async function withPlane<T>(workspaceId: string, call: (d: DataPlane) => Promise<T>): Promise<T> {
  try {
    return await call(await dataPlane(workspaceId));
  } catch (e) {
    if (ConnectError.from(e).code !== Code.Unauthenticated) throw e;
    return call(await dataPlane(workspaceId, true));
  }
}

/** ApiError is an error as the API gave it: canonical code, message, and the ErrorDetail's reason and stage. */
export interface ApiError {
  code: string;
  message: string;
  reason?: string;
  stage?: string;
}

/** apiError reads any thrown value as an ApiError. */
export function apiError(e: unknown): ApiError {
  const ce = ConnectError.from(e);
  const out: ApiError = { code: codeName(ce.code), message: ce.rawMessage };
  const d = ce.findDetails(ErrorDetailSchema)[0];
  if (d) {
    if (d.reason) out.reason = FailureReason[d.reason];
    if (d.stage) out.stage = FailureStage[d.stage];
  }
  return out;
}

/**
 * errorText formats an ApiError in one line: code, message, reason and
 * stage. The message may quote names a tenant or a guest chose (a guest
 * writes the data plane's): its control and bidi characters are escaped.
 */
export function errorText(e: ApiError): string {
  const extra = [e.reason && `reason ${e.reason}`, e.stage && `stage ${e.stage}`].filter(Boolean).join(", ");
  return `${e.code}: ${visible(e.message, false)}${extra ? ` (${extra})` : ""}`;
}

/** codeName is the canonical name of a Connect code, as in the protocol (invalid_argument). */
export function codeName(c: Code): string {
  return Code[c].replace(/[A-Z]/g, (m, i) => (i ? "_" : "") + m.toLowerCase());
}
