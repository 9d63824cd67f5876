// Data-plane sessions: issued on the control plane, cached per Workspace
// handle, renewed before they expire or when the data plane says they did.
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client } from "@connectrpc/connect";
import { FileService, ProcessService } from "../gen/kibotos/data/v1/data_pb.js";
import type { KibotosBase } from "./client.js";
import { KibotosError, sessionRefused, toKibotosError, wrap } from "./errors.js";
import { maxDataPlaneMessage } from "./bounded.js";

/**
 * RENEW_BEFORE_MS is how long before its expiry a cached session is
 * replaced, unless that is more than half its life (see DataPlane.renewBeforeMs).
 */
const RENEW_BEFORE_MS = 30_000;

/** Session is a data-plane session: a bearer token for the kibotos.data.v1 services at endpoint. */
export interface Session {
  id: string;
  token: string;
  endpoint: string;
  /** expiresAt is undefined when the server did not say. */
  expiresAt?: Date;
}

/** DataPlane is one session and the data-plane clients that use it. */
export interface DataPlane {
  session: Session;
  /** generation is the run of the Workspace the session reaches (its token says); undefined when the token does not tell. */
  generation?: string;
  proc: Client<typeof ProcessService>;
  files: Client<typeof FileService>;
  /**
   * renewBeforeMs is how long before its expiry the session is replaced:
   * RENEW_BEFORE_MS, or half of what the session had left when issued if
   * that is less, so that a short session serves calls for half its life
   * rather than none.
   */
  renewBeforeMs: number;
  /** fileBytes is whether the endpoint serves FILE_BYTES_PATH; undefined until a call tells. */
  fileBytes?: boolean;
}

/**
 * Sessions issues the sessions of one Workspace: one at a time, shared by
 * every call of the handle, replaced when it is within 30 seconds of expiry
 * (or in the second half of its life, when that is shorter) or the data
 * plane reports it expired.
 */
export class Sessions {
  private current?: Promise<DataPlane>; // the session in use, or being issued
  private latest?: DataPlane; // what current resolved to

  constructor(
    private readonly client: KibotosBase,
    private readonly workspaceId: string,
  ) {}

  /** streamsRequests is whether a request body can be a stream here (Node.js) or must be whole (the fetch of browsers). */
  get streamsRequests(): boolean {
    return this.client.connections.streamsRequests;
  }

  /** get returns the current data plane, issuing a session when there is none or it is about to expire. */
  async get(): Promise<DataPlane> {
    const pending = this.current;
    if (pending !== undefined) {
      const d = await pending.catch(() => undefined);
      if (this.current !== pending) return this.get(); // another call replaced or forgot it meanwhile
      const exp = d?.session.expiresAt;
      if (d !== undefined && (exp === undefined || exp.getTime() - Date.now() > d.renewBeforeMs)) return d;
    }
    const issued = this.issue();
    this.current = issued;
    return issued;
  }

  /** forget drops d, whose session the data plane reported expired, unless another call replaced it. */
  forget(d: DataPlane): void {
    if (this.latest === d) {
      this.current = undefined;
      this.latest = undefined;
    }
  }

  /**
   * dropRefused forgets d when e is the data plane refusing its session so
   * that a new one may succeed (sessionRefused), whether or not the call is
   * sent again (a streamed source cannot be), so that the handle's next
   * call issues a new one; it reports whether it did.
   */
  dropRefused(d: DataPlane, e: unknown): boolean {
    if (!sessionRefused(toKibotosError(e))) return false;
    this.forget(d);
    return true;
  }

  private async issue(): Promise<DataPlane> {
    const d = await this.issueOne();
    this.latest = d;
    return d;
  }

  private async issueOne(): Promise<DataPlane> {
    const resp = await wrap(
      this.client.sessions.issueSession({ workspaceId: this.workspaceId, ttlSeconds: this.client.sessionTtlSeconds }),
    );
    const session: Session = {
      id: resp.sessionId,
      token: resp.token,
      endpoint: resp.endpoint,
      expiresAt: resp.expiresAt ? timestampDate(resp.expiresAt) : undefined,
    };
    const transport = this.client.connections.transport(session.endpoint, session.token, maxDataPlaneMessage);
    const left = session.expiresAt === undefined ? Infinity : session.expiresAt.getTime() - Date.now();
    return {
      session,
      generation: tokenGeneration(session.token),
      renewBeforeMs: Math.min(RENEW_BEFORE_MS, left / 2),
      proc: createClient(ProcessService, transport),
      files: createClient(FileService, transport),
    };
  }

  /**
   * getIn returns the data plane of the Workspace's run generation
   * (undefined: whichever runs now). Once a later run's session replaced
   * that run's, it rejects with not_found: what the call names (a process
   * by pid) ended with its run, and the same name in the later run is
   * another's.
   */
  private async getIn(generation?: string): Promise<DataPlane> {
    const d = await this.get();
    if (generation !== undefined && d.generation !== undefined && d.generation !== generation) {
      throw new KibotosError(
        `it ran in an earlier start of workspace ${this.workspaceId} (generation ${generation}; generation ${d.generation} runs now) and ended with it`,
        Code.NotFound,
      );
    }
    return d;
  }

  /**
   * unary makes a unary data-plane call, with a new session once more when
   * the data plane reports the session expired; in the run generation when
   * given (see getIn).
   */
  async unary<T>(call: (d: DataPlane) => Promise<T>, generation?: string): Promise<T> {
    for (let retried = false; ; retried = true) {
      const d = await this.getIn(generation);
      try {
        return await call(d);
      } catch (e) {
        if (retried || !this.dropRefused(d, e)) throw toKibotosError(e);
      }
    }
  }

  /**
   * stream opens a server stream and reads its first message, with a new
   * session once more when that fails because the session expired. It
   * returns the first message (undefined when the stream ended without
   * one), the iterator that goes on with the rest, and the run of the
   * Workspace the stream reached.
   */
  async stream<T>(open: (d: DataPlane) => AsyncIterable<T>): Promise<{ first?: T; rest: AsyncIterator<T>; generation?: string }> {
    for (let retried = false; ; retried = true) {
      const d = await this.get();
      const rest = open(d)[Symbol.asyncIterator]();
      try {
        const r = await rest.next();
        return { first: r.done ? undefined : r.value, rest, generation: d.generation };
      } catch (e) {
        if (retried || !this.dropRefused(d, e)) throw toKibotosError(e);
      }
    }
  }
}

/**
 * tokenGeneration is the generation a session token names: its third of
 * five dot-separated fields, <session>.<workspace>.<generation>.<expiry>.<mac>.
 */
function tokenGeneration(token: string): string | undefined {
  const f = token.split(".");
  return f.length === 5 && /^(0|[1-9][0-9]*)$/.test(f[2]) ? f[2] : undefined;
}
