// Processes in a Workspace: started, followed, fed input, signalled.
import { Code } from "@connectrpc/connect";
import type { ProcessEvent } from "../gen/kibotos/data/v1/data_pb.js";
import { KibotosError, toKibotosError } from "./errors.js";
import type { Sessions } from "./session.js";
import { bytesOf, concat, pieces, type Source } from "./bytes.js";

/** INPUT_CHUNK bounds the bytes of one SendInput. */
const INPUT_CHUNK = 32 * 1024;

/** PtySize is the size of a pseudo-terminal, in characters. */
export interface PtySize {
  cols: number;
  rows: number;
}

/** ExecOptions describe a process to run. */
export interface ExecOptions {
  /** onStdout receives the process's standard output (all output on a PTY) as it arrives. */
  onStdout?: (data: Uint8Array) => void;
  /** onStderr receives the process's standard error as it arrives. */
  onStderr?: (data: Uint8Array) => void;
  /**
   * stdin is sent to the process's input, which is then closed. true keeps
   * the input open for Process.sendInput and Process.closeInput; absent
   * gives the process an empty input. A stream stays the caller's: once
   * the process exits (or is no longer followed) the SDK reads no more of
   * it, and leaves no listener on a Node.js stream, nor destroys it, so the
   * next call reads on where this one stopped. The one chunk a read already
   * under way when the process exited takes is left to return on its own
   * and then dropped: a chunk being sent, or the next item of an async
   * iterable the SDK was waiting for (whose iterator is then closed); a
   * Node.js Readable waiting for data gives up its wait and loses nothing.
   */
  stdin?: Source | true;
  /** pty runs the process on a pseudo-terminal of this size (true: 80x24). */
  pty?: PtySize | true;
  /** cwd is the working directory; absent is the user's home directory. */
  cwd?: string;
  /** env is added to the guest's environment. */
  env?: Record<string, string>;
  /** user is a user of the guest; absent is root. */
  user?: string;
  /** tag names the process, unique among running processes. */
  tag?: string;
  /**
   * timeoutMs kills the process (SIGKILL to its process group) when it has
   * not exited this long after it started; the call then rejects with
   * deadline_exceeded. Absent or 0 waits as long as it runs.
   */
  timeoutMs?: number;
  /** signal kills the process, as timeoutMs does, when it aborts; the call rejects with canceled. */
  signal?: AbortSignal;
  /**
   * endWithCaller has the guest kill the process and its group when the
   * stream that started it ends before the process does: this program
   * died, or lost its connection. Otherwise a process outlives its caller.
   */
  endWithCaller?: boolean;
}

/**
 * ExecResult is how a process ended: exitCode when it exited, signal (such
 * as "SIGKILL") when a signal ended it. stdout and stderr hold the output
 * decoded as UTF-8, each only when no onStdout or onStderr callback took it.
 */
export interface ExecResult {
  exitCode: number;
  signal: string;
  stdout: string;
  stderr: string;
}

/**
 * Process is a process of a Workspace that start follows: wait resolves
 * when it exits; kill, sendInput, closeInput and resize act on it in the
 * guest. It belongs to one run of the Workspace and one boot of its guest:
 * after a stop and start, or a reset of the guest (a reboot inside it),
 * those calls reject with not_found rather than reach a new process that
 * has its pid.
 */
export class Process {
  /** pid is the process's pid in the guest. */
  readonly pid: number;
  private readonly done: Promise<ExecResult>;
  private readonly stop: AbortController; // aborts the stream
  private ended?: KibotosError; // why the wait ended other than by an exit
  private inputErr?: KibotosError; // reading ExecOptions.stdin failed

  /** @internal */
  constructor(
    private readonly sessions: Sessions,
    pid: number,
    rest: AsyncIterator<ProcessEvent>,
    opts: ExecOptions,
    stopStream: AbortController,
    /** @internal the run of the Workspace it belongs to (its session's); undefined when not known */
    readonly generation?: string,
    /** the boot of the guest it was started in: a reset's processes are not it */
    private readonly bootId = "",
  ) {
    this.pid = pid;
    this.stop = stopStream;
    this.done = this.follow(rest, opts);
    this.done.catch(() => undefined); // wait() reports it
    if (opts.stdin !== undefined && opts.stdin !== true) void this.forwardInput(opts.stdin);
    this.bound(opts);
  }

  /**
   * wait resolves once the process exits. It rejects when the stream ended
   * first: the connection broke, detach was called, or timeoutMs or signal
   * killed the process.
   */
  wait(): Promise<ExecResult> {
    return this.done;
  }

  /** kill sends signal (default SIGKILL) to the process's process group. */
  async kill(signal = "SIGKILL"): Promise<void> {
    await this.sessions.unary((d) => d.proc.signalProcess({ process: this.selector(), signal }), this.generation);
  }

  /** sendInput writes data to the process's input or PTY; the process must have been started with stdin. */
  async sendInput(data: string | Uint8Array): Promise<void> {
    const bytes = bytesOf(data);
    let i = 0;
    do {
      const part = bytes.subarray(i, i + INPUT_CHUNK);
      await this.sessions.unary((d) => d.proc.sendInput({ process: this.selector(), data: part }), this.generation);
      i += INPUT_CHUNK;
    } while (i < bytes.length);
  }

  /** closeInput closes the process's input. */
  async closeInput(): Promise<void> {
    await this.sessions.unary((d) => d.proc.closeInput({ process: this.selector() }), this.generation);
  }

  /** resize changes the size of the process's PTY. */
  async resize(size: PtySize): Promise<void> {
    await this.sessions.unary((d) => d.proc.resizeTerminal({ process: this.selector(), size }), this.generation);
  }

  /**
   * detach stops following the process, which runs on in the guest; a wait
   * in progress rejects with canceled.
   */
  detach(): void {
    this.endStream(new KibotosError(`detached from pid ${this.pid} before it exited`, Code.Canceled));
  }

  private selector() {
    return { selector: { case: "pid" as const, value: this.pid }, bootId: this.bootId };
  }

  private endStream(why: KibotosError): void {
    this.ended ??= why;
    this.stop.abort(why);
  }

  /** bound kills the process when opts.timeoutMs passes or opts.signal aborts before it exits. */
  private bound(opts: ExecOptions): void {
    const cut = (why: KibotosError) => {
      this.ended ??= why;
      // The exit the kill causes ends the stream; should the kill fail, end it here.
      this.kill().catch(() => this.endStream(why));
    };
    let timer: NodeJS.Timeout | undefined;
    if (opts.timeoutMs) {
      timer = setTimeout(
        () => cut(new KibotosError(`pid ${this.pid} did not exit within ${opts.timeoutMs} ms; killed`, Code.DeadlineExceeded)),
        opts.timeoutMs,
      );
    }
    const onAbort = () => cut(new KibotosError(`pid ${this.pid} was killed: the call was aborted`, Code.Canceled, { cause: opts.signal?.reason }));
    if (opts.signal?.aborted) onAbort();
    else opts.signal?.addEventListener("abort", onAbort, { once: true });
    const clear = () => {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
    };
    this.done.then(clear, clear);
  }

  /** follow hands the process's events to the callbacks until it exits or the stream ends. */
  private async follow(rest: AsyncIterator<ProcessEvent>, opts: ExecOptions): Promise<ExecResult> {
    const out: Uint8Array[] = [];
    const errOut: Uint8Array[] = [];
    const onStdout = opts.onStdout ?? ((b: Uint8Array) => out.push(b));
    const onStderr = opts.onStderr ?? ((b: Uint8Array) => errOut.push(b));
    try {
      for (let r = await rest.next(); !r.done; r = await rest.next()) {
        const ev = r.value.event;
        switch (ev.case) {
          case "stdout":
          case "pty":
            onStdout(ev.value);
            break;
          case "stderr":
            onStderr(ev.value);
            break;
          case "exited": {
            if (this.ended !== undefined) throw this.ended; // killed by timeoutMs or signal
            if (this.inputErr !== undefined) throw this.inputErr;
            const dec = new TextDecoder();
            return {
              exitCode: ev.value.exitCode,
              signal: ev.value.signal,
              stdout: out.length ? dec.decode(concat(out)) : "",
              stderr: errOut.length ? dec.decode(concat(errOut)) : "",
            };
          }
        }
      }
    } catch (e) {
      throw this.ended ?? toKibotosError(e);
    } finally {
      this.stop.abort();
    }
    throw this.ended ?? new KibotosError(`the stream of pid ${this.pid} ended before it exited`, Code.Unavailable);
  }

  /**
   * forwardInput sends src to the process's input, each piece as it comes
   * (an interactive program waits for its line), then closes it. It stops
   * when the process's stream ends, and closes its reading of src: a Node.js
   * stream is let go of at once (start's hold on it ends with the stream),
   * keeping what it was not asked for; another source's read already under
   * way is left to return on its own, and what it returns is dropped. Only a
   * failure to read src is reported (by wait): a failure to send means the
   * process no longer reads. The input is closed after a failure to read src
   * too, as at its end: a process reading it to its end (cat) would
   * otherwise wait for ever, and its wait with it.
   */
  private async forwardInput(src: Source): Promise<void> {
    const it = pieces(src, INPUT_CHUNK)[Symbol.asyncIterator]();
    try {
      for (;;) {
        let r: IteratorResult<Uint8Array>;
        try {
          r = await it.next();
        } catch (e) {
          if (this.stop.signal.aborted) return; // the read was cut by the stream's end, not a failure of src
          this.inputErr = new KibotosError(`reading stdin: ${e instanceof Error ? e.message : String(e)}`, Code.Unknown, { cause: e });
          break;
        }
        if (r.done || this.stop.signal.aborted) break;
        try {
          await this.sendInput(r.value);
        } catch {
          return; // the process exited or stopped reading; wait reports how it ended
        }
      }
      if (!this.stop.signal.aborted) await this.closeInput().catch(() => undefined);
    } finally {
      // Ends pieces, and through it the iteration of src, which would
      // otherwise stay suspended, attached to src, and take its next bytes.
      await it.return?.(undefined).catch(() => undefined);
    }
  }
}
