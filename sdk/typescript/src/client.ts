// The Kibotos client: Workspaces on a control plane, created and waited for.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, createClient, type Client } from "@connectrpc/connect";
import {
  CreateWorkspaceRequestSchema,
  type NetworkPolicySchema,
  SessionService,
  StopMode,
  type WorkspaceExpirationPolicySchema,
  type Workspace as WorkspaceInfo,
  WorkspaceService,
  WorkspaceState,
} from "../gen/kibotos/ctrl/v1/ctrl_pb.js";
import { commandMetadata } from "./command.js";
import { KibotosError, toKibotosError, WorkspaceStateError, wrap } from "./errors.js";
import type { Transports } from "./transport.js";
import { Workspace } from "./workspace.js";

/** DEFAULT_MEMORY_BYTES is the guest RAM of a Workspace created without memoryBytes. */
export const DEFAULT_MEMORY_BYTES = 512 * 1024 * 1024;

/** REWATCH_DELAY_MS is the pause before watching again when a watch ended early. */
const REWATCH_DELAY_MS = 1000;

/** ConnectOptions say which control plane to call, and how. */
export interface ConnectOptions {
  /** url is the control plane's base URL, such as http://127.0.0.1:8870. */
  url: string;
  /** token is an API token of a project. */
  token: string;
  /**
   * sessionTtlSeconds is the lifetime of the data-plane sessions the
   * Workspaces issue; 0, the default, leaves it to the server (an hour).
   */
  sessionTtlSeconds?: number;
}

/** CreateWorkspaceOptions describe a new Workspace; absent fields take the defaults. */
export interface CreateWorkspaceOptions {
  /**
   * template is a Template ID, or ID@REVISION for one revision; absent is
   * the deployment's built-in Template, and no revision its default one.
   */
  template?: string;
  /** cpuMillis is the CPU share in thousandths of a core; 0 is the server's default. */
  cpuMillis?: number;
  /** memoryBytes is the guest RAM, a whole number of MiB and at least 128 MiB. */
  memoryBytes?: number;
  /** diskBytes is the capacity of the writable layer, a whole number of MiB; 0 is the host's default. */
  diskBytes?: number;
  /** capabilities the host must offer, such as "screen". */
  capabilities?: string[];
  /** networkPolicy is the initial network policy; absent is DENY_ALL. */
  networkPolicy?: MessageInitShape<typeof NetworkPolicySchema>;
  /** expiration is the initial expiration; absent sets none. */
  expiration?: MessageInitShape<typeof WorkspaceExpirationPolicySchema>;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  /**
   * commandId is the idempotency key of the create; absent is a fresh one.
   * Retrying with the same ID and options returns the first Workspace.
   */
  commandId?: string;
  /** signal ends the wait (the Workspace goes on starting). */
  signal?: AbortSignal;
}

/** WaitOptions bound a call that waits for a Workspace's state. */
export interface WaitOptions {
  /** signal ends the wait; the Workspace goes on where it was going. */
  signal?: AbortSignal;
}

/** goal is a state a call waits for, and the states on the way to it. */
interface Goal {
  state: WorkspaceState;
  via: WorkspaceState[];
}

const untilAvailable: Goal = {
  state: WorkspaceState.AVAILABLE,
  via: [WorkspaceState.CREATING, WorkspaceState.STARTING, WorkspaceState.UNKNOWN],
};
const untilStopped: Goal = { state: WorkspaceState.STOPPED, via: [WorkspaceState.STOPPING, WorkspaceState.UNKNOWN] };
const untilDeleted: Goal = { state: WorkspaceState.DELETED, via: [WorkspaceState.DELETING] };

/**
 * KibotosBase is the client both entry points export as Kibotos, on the
 * transports of each: HTTP/2 from Node.js (@kibotos/sdk), the fetch API
 * in a browser (@kibotos/sdk/web). It calls one control plane with an API
 * token. Its lifecycle calls (createWorkspace, startWorkspace,
 * stopWorkspace, deleteWorkspace) resolve once the Workspace has reached
 * the state the call asks for, following WatchWorkspace until then. Every
 * call rejects with a KibotosError.
 */
export class KibotosBase {
  /** @internal */
  readonly workspaces: Client<typeof WorkspaceService>;
  /** @internal */
  readonly sessions: Client<typeof SessionService>;
  /** @internal */
  readonly sessionTtlSeconds: number;

  /** @internal */
  constructor(
    opts: ConnectOptions,
    /** @internal */
    readonly connections: Transports,
  ) {
    if (!opts.url) throw new KibotosError("Kibotos: url is required", Code.InvalidArgument);
    const transport = this.connections.transport(opts.url, opts.token);
    this.workspaces = createClient(WorkspaceService, transport);
    this.sessions = createClient(SessionService, transport);
    this.sessionTtlSeconds = opts.sessionTtlSeconds ?? 0;
  }

  /**
   * close closes the client's connections. In Node.js, calls in flight and
   * any later call fail with canceled, and nothing retries them.
   */
  close(): void {
    this.connections.close();
  }

  /**
   * createWorkspace creates a Workspace and resolves once it is AVAILABLE.
   * A Workspace that ends FAILED rejects with a WorkspaceStateError carrying
   * its failure's reason and stage.
   */
  async createWorkspace(opts: CreateWorkspaceOptions = {}): Promise<Workspace> {
    let template: { templateId: string; revision: string } | undefined;
    if (opts.template) {
      const [id, ...rest] = opts.template.split("@");
      const rev = rest.join("@");
      if (!id || (rest.length > 0 && !rev)) {
        throw new KibotosError(`template "${opts.template}": want ID or ID@REVISION`, Code.InvalidArgument);
      }
      template = { templateId: id, revision: rev };
    }
    const req = create(CreateWorkspaceRequestSchema, {
      command: commandMetadata(opts.commandId),
      spec: {
        template,
        resources: {
          cpuMillis: opts.cpuMillis ?? 0,
          memoryBytes: BigInt(opts.memoryBytes || DEFAULT_MEMORY_BYTES),
          writableLayerBytes: BigInt(opts.diskBytes ?? 0),
        },
        capabilities: opts.capabilities?.length ? { required: opts.capabilities } : undefined,
        networkPolicy: opts.networkPolicy,
        expiration: opts.expiration,
      },
      labels: opts.labels,
      annotations: opts.annotations,
    });
    const resp = await wrap(this.workspaces.createWorkspace(req, { signal: opts.signal }));
    return this.handle(await this.waitFor(resp.workspace!, untilAvailable, opts.signal));
  }

  /** getWorkspace returns a handle on the Workspace id as it is now, in whatever state. */
  async getWorkspace(id: string): Promise<Workspace> {
    const resp = await wrap(this.workspaces.getWorkspace({ workspaceId: id }));
    return this.handle(resp.workspace!);
  }

  /**
   * listWorkspaces lists the project's Workspaces, every page, those that
   * carry every label of labelSelector when it is given.
   */
  async listWorkspaces(opts: { labelSelector?: Record<string, string> } = {}): Promise<WorkspaceInfo[]> {
    const all: WorkspaceInfo[] = [];
    let pageToken = "";
    do {
      const resp = await wrap(this.workspaces.listWorkspaces({ labelSelector: opts.labelSelector, pageToken }));
      all.push(...resp.workspaces);
      pageToken = resp.nextPageToken;
    } while (pageToken !== "");
    return all;
  }

  /**
   * startWorkspace starts a STOPPED Workspace, or retries the launch of a
   * FAILED one, and resolves once it is AVAILABLE.
   */
  async startWorkspace(id: string, opts: WaitOptions = {}): Promise<Workspace> {
    const resp = await wrap(
      this.workspaces.startWorkspace({ command: commandMetadata(), workspaceId: id }, { signal: opts.signal }),
    );
    return this.handle(await this.waitFor(resp.workspace!, untilAvailable, opts.signal));
  }

  /** stopWorkspace stops a Workspace and resolves once it is STOPPED; force skips syncing the guest. */
  async stopWorkspace(id: string, opts: WaitOptions & { force?: boolean } = {}): Promise<Workspace> {
    const mode = opts.force ? StopMode.FORCE : StopMode.NORMAL;
    const resp = await wrap(
      this.workspaces.stopWorkspace({ command: commandMetadata(), workspaceId: id, mode }, { signal: opts.signal }),
    );
    return this.handle(await this.waitFor(resp.workspace!, untilStopped, opts.signal));
  }

  /** deleteWorkspace deletes a Workspace and resolves once it is DELETED. */
  async deleteWorkspace(id: string, opts: WaitOptions = {}): Promise<void> {
    const resp = await wrap(
      this.workspaces.deleteWorkspace({ command: commandMetadata(), workspaceId: id }, { signal: opts.signal }),
    );
    await this.waitFor(resp.workspace!, untilDeleted, opts.signal);
  }

  private handle(info: WorkspaceInfo): Workspace {
    return new Workspace(this, info);
  }

  /**
   * waitFor follows WatchWorkspace from ws, the state a call returned, until
   * the Workspace is in g's state. A watch that ends early, or that the
   * server cannot serve for a moment (unavailable), is opened again.
   */
  private async waitFor(ws: WorkspaceInfo, g: Goal, signal?: AbortSignal): Promise<WorkspaceInfo> {
    for (let rewatch = false; ; rewatch = true) {
      if (ws.state === g.state) return ws;
      if (!g.via.includes(ws.state)) throw new WorkspaceStateError(ws, g.state);
      if (rewatch) await sleep(REWATCH_DELAY_MS, signal);
      try {
        ws = await this.watch(ws, g, signal);
      } catch (e) {
        const err = toKibotosError(e);
        if (g.state === WorkspaceState.DELETED && err.code === Code.NotFound) return ws; // gone altogether
        if (err.code !== Code.Unavailable || signal?.aborted) throw err;
      }
    }
  }

  /** watch reads one WatchWorkspace stream until ws is in g's state or leaves the way to it. */
  private async watch(ws: WorkspaceInfo, g: Goal, signal?: AbortSignal): Promise<WorkspaceInfo> {
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort);
    try {
      for await (const msg of this.workspaces.watchWorkspace({ workspaceId: ws.workspaceId }, { signal: ctl.signal })) {
        ws = msg.workspace!;
        if (ws.state === g.state || !g.via.includes(ws.state)) return ws;
      }
      return ws;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      ctl.abort(); // ends the stream when the loop returned early
    }
  }
}

/** sleep waits ms, or rejects as cancelled when signal aborts first. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new KibotosError("the wait was aborted", Code.Canceled, { cause: signal.reason }));
      return;
    }
    const onAbort = () => {
      clearTimeout(t);
      reject(new KibotosError("the wait was aborted", Code.Canceled, { cause: signal?.reason }));
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
