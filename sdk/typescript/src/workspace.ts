// A handle on one Workspace: its processes and files, through the data
// plane, with a session the handle issues and renews.
import { Code } from "@connectrpc/connect";
import { type Workspace as WorkspaceInfo, WorkspaceState } from "../gen/kibotos/ctrl/v1/ctrl_pb.js";
import type { ProcessInfo } from "../gen/kibotos/data/v1/data_pb.js";
import type { KibotosBase, WaitOptions } from "./client.js";
import { KibotosError, notReached, toKibotosError } from "./errors.js";
import { Files } from "./files.js";
import { type ExecOptions, type ExecResult, Process } from "./process.js";
import { type Session, Sessions } from "./session.js";
import { taken } from "./bytes.js";

/**
 * Workspace is a handle on one Workspace. Its data-plane calls (exec,
 * start, files) need the Workspace AVAILABLE; they share one session, which
 * the handle issues on first use and issues again when it is within 30
 * seconds of expiry (or in the second half of its life, when that is
 * shorter) or the data plane reports it expired.
 */
export class Workspace {
  /** id is the Workspace's ID. */
  readonly id: string;
  /** info is the Workspace as it was when the handle was made. */
  readonly info: WorkspaceInfo;
  /** files are the Workspace's file calls. */
  readonly files: Files;
  private readonly sessions: Sessions;

  /** @internal */
  constructor(
    private readonly client: KibotosBase,
    info: WorkspaceInfo,
  ) {
    this.id = info.workspaceId;
    this.info = info;
    this.sessions = new Sessions(client, this.id);
    this.files = new Files(this.sessions);
  }

  /** session returns the handle's session, issuing one when it has none or it is about to expire. */
  async session(): Promise<Session> {
    return (await this.sessions.get()).session;
  }

  /**
   * exec runs args in the Workspace and resolves once it ends: args[0] is
   * the program, looked up in PATH. Output goes to onStdout and onStderr as
   * it arrives. A process that exited non-zero, or that a signal ended, is
   * not an error: the result says so. When following the process fails
   * (a callback threw, the connection broke), exec kills it before it
   * rejects: it leaves nothing running, or, when the data plane cannot be
   * reached to kill it for 10 seconds (the deployment restarts), or
   * refuses the kill unavailable while the control plane says the
   * Workspace still runs the process's execution (a host agent just
   * restarted, out of service until the control plane takes its
   * registration), says in its error that the process may still run. A
   * Workspace that stopped ended the process with its execution: exec then
   * rejects at once.
   */
  async exec(args: string[], opts: ExecOptions = {}): Promise<ExecResult> {
    const p = await this.start(args, opts);
    try {
      return await p.wait();
    } catch (e) {
      throw await killAfter(p, toKibotosError(e), this.id, () => this.executionEnded(p.generation));
    }
  }

  /**
   * executionEnded resolves to whether the control plane says the
   * Workspace no longer runs its execution of run generation (undefined:
   * whichever ran): it is not AVAILABLE (it stopped, or stops, and its
   * processes with it; it was deleted or failed), or it runs a later
   * generation. When the control plane cannot say (it cannot be reached,
   * or refuses the call), or the Workspace is AVAILABLE or UNKNOWN (its
   * host not heard from) at generation, the execution may run: false.
   */
  private async executionEnded(generation?: string): Promise<boolean> {
    let ws: WorkspaceInfo | undefined;
    try {
      ws = (await this.client.workspaces.getWorkspace({ workspaceId: this.id })).workspace;
    } catch (e) {
      return toKibotosError(e).code === Code.NotFound;
    }
    if (ws?.state === WorkspaceState.AVAILABLE || ws?.state === WorkspaceState.UNKNOWN) {
      return generation !== undefined && String(ws.generation) !== generation;
    }
    return true;
  }

  /**
   * start starts args in the Workspace and resolves once the process runs;
   * the returned Process's wait resolves when it exits. With opts.signal
   * already aborted it rejects with canceled and starts nothing.
   */
  async start(args: string[], opts: ExecOptions = {}): Promise<Process> {
    // stop ends the stream, and the hold on opts.stdin with it; opts.signal
    // kills the process instead (see Process).
    const stop = new AbortController();
    const { stdin } = opts;
    if (stdin !== undefined && stdin !== true && typeof stdin !== "string") opts = { ...opts, stdin: taken(stdin, stop.signal) };
    try {
      refuseAborted(opts.signal);
      const pty = opts.pty === true ? { cols: 80, rows: 24 } : opts.pty;
      const req = {
        args,
        env: opts.env,
        cwd: opts.cwd ?? "",
        user: opts.user ?? "",
        tag: opts.tag ?? "",
        pty,
        stdin: opts.stdin !== undefined,
        endWithCaller: opts.endWithCaller ?? false,
      };
      const { first, rest, generation } = await this.sessions.stream((d) => {
        refuseAborted(opts.signal); // it may have aborted while the session was issued
        return d.proc.startProcess(req, { signal: stop.signal });
      });
      if (first?.event.case !== "started") {
        throw new KibotosError("StartProcess: the stream did not begin with the started event", Code.Internal);
      }
      return new Process(this.sessions, first.event.value.pid, rest, opts, stop, generation, first.event.value.bootId);
    } catch (e) {
      stop.abort(); // no process: the call lets go of opts.stdin
      throw e;
    }
  }

  /** processes lists the processes started in the Workspace that run, and those that ended recently. */
  async processes(): Promise<ProcessInfo[]> {
    const resp = await this.sessions.unary((d) => d.proc.listProcesses({}));
    return resp.processes;
  }

  /** stop stops the Workspace and resolves once it is STOPPED. */
  stop(opts: WaitOptions & { force?: boolean } = {}): Promise<Workspace> {
    return this.client.stopWorkspace(this.id, opts);
  }

  /** delete deletes the Workspace and resolves once it is DELETED. */
  delete(opts: WaitOptions = {}): Promise<void> {
    return this.client.deleteWorkspace(this.id, opts);
  }
}

/** KILL_TIMEOUT_MS bounds the kill exec sends when following its process failed. */
const KILL_TIMEOUT_MS = 10_000;

/** KILL_RETRY_MS is how often exec sends its kill again while the data plane cannot be reached, or cannot serve it yet. */
const KILL_RETRY_MS = 200;

/**
 * killAfter kills p, whose following failed with err, for up to
 * KILL_TIMEOUT_MS: it sends the kill again while the data plane cannot be
 * reached (the deployment restarts), and while it answers unavailable
 * unless ended says the execution p belongs to has ended. The data plane
 * answers unavailable both for a Workspace that stopped, whose processes
 * ended with it, and for one that runs on while it cannot serve it yet: a
 * host agent just restarted serves nothing until the control plane takes
 * its registration ("this host is out of service"), nor a Workspace before
 * it finds its execution running again. Only the control plane tells them
 * apart. It returns what exec rejects with: err, saying so when the
 * process may still run.
 */
async function killAfter(p: Process, err: KibotosError, workspaceId: string, ended: () => Promise<boolean>): Promise<KibotosError> {
  const giveUp = Date.now() + KILL_TIMEOUT_MS;
  let kerr: KibotosError | undefined;
  for (;;) {
    kerr = await p.kill().then(
      () => undefined,
      (e: unknown) => toKibotosError(e),
    );
    if (kerr === undefined || kerr.code !== Code.Unavailable) break;
    if (!notReached(kerr) && (await ended())) return err; // it ended with its execution
    if (Date.now() + KILL_RETRY_MS > giveUp) break;
    await new Promise((resolve) => setTimeout(resolve, KILL_RETRY_MS));
  }
  // not_found: it ended (and was reaped); failed_precondition: the guest says it and its group ended.
  if (kerr === undefined || kerr.code === Code.NotFound || kerr.code === Code.FailedPrecondition) return err;
  let why = "killing the process";
  if (notReached(kerr)) why = `pid ${p.pid} may still run: the data plane could not be reached to kill it`;
  else if (kerr.code === Code.Unavailable) why = `pid ${p.pid} may still run: the data plane could not kill it while workspace ${workspaceId} runs`;
  return new KibotosError(`${err.message} (${why}: ${kerr.message})`, err.code, {
    reason: err.reason,
    stage: err.stage,
    observedWorkspace: err.observedWorkspace,
    cause: err,
  });
}

/** refuseAborted throws canceled when signal has aborted: a process must not start for a call its caller gave up. */
function refuseAborted(signal?: AbortSignal): void {
  if (signal?.aborted) {
    throw new KibotosError("the call was aborted before the process started", Code.Canceled, { cause: signal.reason });
  }
}
