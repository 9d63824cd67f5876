// Files of a Workspace: read, write, stream, list, inspect, move, watch.
import { create } from "@bufbuild/protobuf";
import {
  type FileInfo,
  FileType,
  type WatchDirectoryResponse,
  type WriteFileRequest,
  WriteFileRequestSchema,
} from "../gen/kibotos/data/v1/data_pb.js";
import { bytesOf, chunks, concat, Rereadable, type Source, taken } from "./bytes.js";
import { Code } from "@connectrpc/connect";
import { KibotosError, toKibotosError } from "./errors.js";
import { fileBytes, fileInfoOf, NotServed, servesFileBytes, writtenFileOf } from "./filebytes.js";
import type { DataPlane, Sessions } from "./session.js";

/** CHUNK_SIZE is the size of the chunks upload sends. */
export const CHUNK_SIZE = 1024 * 1024;

/**
 * REREAD_BYTES bounds what an upload holds of a streamed source to send it
 * again with a new session; a refusal after more was read is the caller's.
 */
const REREAD_BYTES = 8 * CHUNK_SIZE;

/** rising calls report only with counts above the highest so far: an attempt sent again counts from 0. */
function rising(report?: (sent: number) => void): ((sent: number) => void) | undefined {
  if (report === undefined) return undefined;
  let highest = 0;
  return (sent) => {
    if (sent > highest) {
      highest = sent;
      report(sent);
    }
  };
}

/** FileOptions apply to every file call. */
export interface FileOptions {
  /** user makes the call as this user of the guest; absent is root. */
  user?: string;
  /** signal abandons the call. */
  signal?: AbortSignal;
}

/** WriteOptions describe a file write or upload. */
export interface WriteOptions extends FileOptions {
  /** mode's permission bits apply to a new file; 0 is 0o644. */
  mode?: number;
  /** onProgress is called with the number of bytes sent so far, after each chunk. */
  onProgress?: (sent: number) => void;
}

/** DownloadOptions describe a download. */
export interface DownloadOptions extends FileOptions {
  /** onInfo is called, before the first byte, with the metadata of the file read (a symlink's target's). */
  onInfo?: (info: FileInfo) => void;
}

/** FileEvent is one change under a watched directory; its type is a FileEventType. */
export type FileEvent = WatchDirectoryResponse;

/**
 * Files are the file calls of a Workspace (ws.files). Writes go to a
 * temporary file renamed into place, so a failed write leaves an existing
 * file intact.
 */
export class Files {
  /** @internal */
  constructor(private readonly sessions: Sessions) {}

  /** read returns the contents of path. */
  async read(path: string, opts: FileOptions = {}): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    for await (const b of this.download(path, opts)) parts.push(b);
    return concat(parts);
  }

  /** readText returns the contents of path decoded as UTF-8. */
  async readText(path: string, opts: FileOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.read(path, opts));
  }

  /** write writes data (a string is written as UTF-8) to path and returns the written file's metadata. */
  write(path: string, data: string | Uint8Array, opts: WriteOptions = {}): Promise<FileInfo> {
    return this.upload(path, data, opts);
  }

  /**
   * upload writes the bytes of src to path: a Node.js Readable such as
   * fs.createReadStream(localPath), any (async) iterable of byte arrays, a
   * byte array or a string. They go as the body of a PUT of the file bytes
   * path, streamed in chunks of CHUNK_SIZE in Node.js and whole in a browser
   * (through WriteFile's messages to a data plane without it). A src that
   * fails, or opts.signal aborting, abandons the upload, which then writes
   * nothing. A Node.js stream is read, never destroyed: once the call ends
   * no listener of the SDK's is left on it, and an upload that ended before
   * its end leaves the rest in it, for the caller to read or destroy.
   */
  async upload(path: string, src: Source, opts: WriteOptions = {}): Promise<FileInfo> {
    const held = new AbortController(); // aborted when the call ends: it lets go of src
    const data = typeof src === "string" ? bytesOf(src) : taken(src, held.signal);
    // An attempt refused for its session is sent again with a new one:
    // bytes in memory whole (their size is known, and the guest checks
    // it); a streamed source from what the first attempt read of it, held
    // up to REREAD_BYTES.
    const stream = data instanceof Uint8Array ? undefined : new Rereadable(data, CHUNK_SIZE, REREAD_BYTES);
    const body = () => stream?.attempt() ?? data;
    opts = { ...opts, onProgress: rising(opts.onProgress) };
    const start = {
      path,
      user: opts.user ?? "",
      mode: opts.mode ?? 0,
      size: data instanceof Uint8Array ? BigInt(data.length) : undefined,
    };
    // Called at once when an attempt fails, before its body is pulled again.
    const again = async (d: DataPlane, e: unknown, retried: boolean): Promise<boolean> => {
      if (!this.sessions.dropRefused(d, e) || retried) return false;
      if (stream === undefined) return true;
      try {
        return await stream.restart(opts.signal);
      } catch (cause) {
        if (opts.signal?.aborted) throw new KibotosError("the upload was aborted", Code.Canceled, { cause: opts.signal.reason });
        throw new KibotosError(`reading the upload: ${cause instanceof Error ? cause.message : String(cause)}`, Code.Unknown, { cause });
      }
    };
    try {
      for (let retried = false; ; retried = true) {
        const d = await this.sessions.get();
        let served = false;
        const put = new BytesUpload(body(), opts, this.sessions.streamsRequests);
        try {
          served = await servesFileBytes(d, opts.signal);
          if (served) {
            const query = { path, user: start.user, mode: start.mode.toString(8) };
            const resp = await fileBytes(d, "PUT", query, await put.body(), put.signal);
            put.sent();
            return await writtenFileOf(resp);
          }
        } catch (e) {
          if (put.abandoned !== undefined) throw put.abandoned;
          if (!(await again(d, e, retried))) throw toKibotosError(e);
          continue;
        } finally {
          put.done();
        }
        const sending = new Upload(start, body(), opts);
        try {
          const resp = await d.files.writeFile(sending.messages());
          if (sending.abandoned !== undefined) throw sending.abandoned; // a guard: the guest refuses a write without commit
          return resp.file!;
        } catch (e) {
          if (sending.abandoned !== undefined) throw sending.abandoned;
          if (!(await again(d, e, retried))) throw toKibotosError(e);
        } finally {
          sending.done();
        }
      }
    } finally {
      stream?.close();
      held.abort();
    }
  }

  /**
   * download yields the bytes of path in order, from the body of a GET of
   * the file bytes path (through ReadFile from a data plane without it).
   * Breaking out of the loop ends the call.
   */
  async *download(path: string, opts: DownloadOptions = {}): AsyncGenerator<Uint8Array> {
    const stop = linked(opts.signal);
    try {
      // undefined: the data plane has no file bytes path.
      const resp = await this.sessions.unary(async (d) => {
        if (d.fileBytes === false) return undefined;
        try {
          return await fileBytes(d, "GET", { path, user: opts.user ?? "" }, undefined, stop.signal);
        } catch (e) {
          if (e instanceof NotServed) return undefined;
          throw e;
        }
      });
      if (resp === undefined) {
        yield* this.downloadMessages(path, opts, stop);
        return;
      }
      const info = fileInfoOf(resp);
      if (info && opts.onInfo) opts.onInfo(info);
      const reader = resp.body!.getReader();
      for (;;) {
        let r: Awaited<ReturnType<typeof reader.read>>;
        try {
          r = await reader.read();
        } catch (e) {
          if (stop.signal.aborted) throw toKibotosError(e);
          if (info !== undefined) await this.unchangedSince(path, opts.user, info, e);
          throw new KibotosError(`the download broke: ${e instanceof Error ? e.message : String(e)}`, Code.Unavailable, { cause: e });
        }
        if (r.done) return;
        yield r.value;
      }
    } finally {
      stop.abort();
    }
  }

  /**
   * unchangedSince tells a download cut short by its file from one cut by
   * the connection: the guest announced the file's length, and a file that
   * shrank (or was replaced) under the read ends the body early, as a
   * broken connection does. It throws aborted when path now differs from
   * read, the file as the read began; it returns when it does not, or
   * cannot be inspected.
   */
  private async unchangedSince(path: string, user: string | undefined, read: FileInfo, cause: unknown): Promise<void> {
    let now: FileInfo;
    try {
      now = await this.stat(path, { user });
    } catch {
      return;
    }
    const same = (a?: { seconds: bigint; nanos: number }, b?: { seconds: bigint; nanos: number }) =>
      a?.seconds === b?.seconds && a?.nanos === b?.nanos;
    if (now.type === FileType.SYMLINK || (now.size === read.size && same(now.modifiedAt, read.modifiedAt))) return; // a symlink's target was read
    throw new KibotosError(
      `${path} changed while it was read (${read.size} bytes when the read began, ${now.size} now); read it again`,
      Code.Aborted,
      { cause },
    );
  }

  /** downloadMessages is download through FileService.ReadFile, for a data plane without the file bytes path. */
  private async *downloadMessages(path: string, opts: DownloadOptions, stop: AbortController): AsyncGenerator<Uint8Array> {
    {
      const { first, rest } = await this.sessions.stream((d) =>
        d.files.readFile({ path, user: opts.user ?? "" }, { signal: stop.signal }),
      );
      if (first === undefined) return;
      if (first.file && opts.onInfo) opts.onInfo(first.file);
      if (first.data.length > 0) yield first.data;
      try {
        for (let r = await rest.next(); !r.done; r = await rest.next()) yield r.value.data;
      } catch (e) {
        throw toKibotosError(e);
      }
    }
  }

  /** stat returns the metadata of path, without following a final symlink. */
  async stat(path: string, opts: FileOptions = {}): Promise<FileInfo> {
    const resp = await this.sessions.unary((d) =>
      d.files.inspectFile({ path, user: opts.user ?? "" }, { signal: opts.signal }),
    );
    return resp.file!;
  }

  /**
   * list returns the entries of the directory path, descending depth levels
   * (0 and 1 list the directory only), depth-first in name order.
   */
  async list(path: string, opts: FileOptions & { depth?: number } = {}): Promise<FileInfo[]> {
    const resp = await this.sessions.unary((d) =>
      d.files.listDirectory({ path, user: opts.user ?? "", depth: Math.max(opts.depth ?? 0, 0) }, { signal: opts.signal }),
    );
    return resp.entries;
  }

  /**
   * mkdir creates the directory path, and with parents any missing parent
   * (otherwise the parent must exist). mode's permission bits apply; 0 is 0o755.
   */
  async mkdir(path: string, opts: FileOptions & { parents?: boolean; mode?: number } = {}): Promise<FileInfo> {
    const resp = await this.sessions.unary((d) =>
      d.files.createDirectory(
        { path, user: opts.user ?? "", parents: opts.parents ?? false, mode: opts.mode ?? 0 },
        { signal: opts.signal },
      ),
    );
    return resp.directory!;
  }

  /** remove deletes a file or an empty directory, or with recursive a directory and everything in it. */
  async remove(path: string, opts: FileOptions & { recursive?: boolean } = {}): Promise<void> {
    await this.sessions.unary((d) =>
      d.files.deleteFile({ path, user: opts.user ?? "", recursive: opts.recursive ?? false }, { signal: opts.signal }),
    );
  }

  /**
   * rename moves a file or directory from source to destination and returns its new metadata.
   * A directory onto an existing directory is already_exists, unless merge is set: then its
   * entries move into it, directories of the same name merged, other entries replacing their
   * namesakes, each by a rename, so an entry is whole where it is.
   */
  async rename(source: string, destination: string, opts: FileOptions & { merge?: boolean } = {}): Promise<FileInfo> {
    const resp = await this.sessions.unary((d) =>
      d.files.moveFile({ source, destination, user: opts.user ?? "", merge: opts.merge ?? false }, { signal: opts.signal }),
    );
    return resp.file!;
  }

  /**
   * watch yields the changes under the directory path in the order they
   * happen, recursively when asked, until signal aborts or the loop breaks.
   */
  async *watch(path: string, opts: FileOptions & { recursive?: boolean } = {}): AsyncGenerator<FileEvent> {
    const stop = linked(opts.signal);
    try {
      const { first, rest } = await this.sessions.stream((d) =>
        d.files.watchDirectory(
          { path, user: opts.user ?? "", recursive: opts.recursive ?? false },
          { signal: stop.signal },
        ),
      );
      if (first === undefined) return;
      yield first;
      try {
        for (let r = await rest.next(); !r.done; r = await rest.next()) yield r.value;
      } catch (e) {
        if (opts.signal?.aborted) return;
        throw toKibotosError(e);
      }
    } catch (e) {
      if (opts.signal?.aborted) return;
      throw e;
    } finally {
      stop.abort();
    }
  }
}

/**
 * Upload is the request stream of one WriteFile call: start, the data in
 * chunks, then commit. The guest writes the file only after commit, so
 * when src fails or the caller aborts, the stream just ends without it,
 * however the HTTP/2 stream ends (Node.js's ends a stream's request side
 * before it resets it), and abandoned holds the error the call reports.
 */
class Upload {
  abandoned?: KibotosError;
  private readonly stopWaiting = new AbortController(); // the call ended: stop watching opts.signal

  constructor(
    private readonly start: { path: string; user: string; mode: number; size?: bigint },
    private readonly src: Source,
    private readonly opts: WriteOptions,
  ) {}

  async *messages(): AsyncGenerator<WriteFileRequest> {
    yield create(WriteFileRequestSchema, { part: { case: "start", value: this.start } });
    const aborted = abortion(this.opts.signal, this.stopWaiting.signal);
    const it = chunks(this.src, CHUNK_SIZE)[Symbol.asyncIterator]();
    let sent = 0;
    for (;;) {
      let r: IteratorResult<Uint8Array> | "aborted";
      try {
        r = await Promise.race([it.next(), aborted]);
      } catch (e) {
        const why = e instanceof Error ? e.message : String(e);
        this.abandoned = new KibotosError(`reading the upload: ${why}`, Code.Unknown, { cause: e });
        return;
      }
      if (r === "aborted") {
        this.abandoned = new KibotosError("the upload was aborted", Code.Canceled, { cause: this.opts.signal?.reason });
        void it.return?.(undefined).catch(() => undefined);
        return;
      }
      if (r.done) {
        yield create(WriteFileRequestSchema, { part: { case: "commit", value: true } });
        return;
      }
      yield create(WriteFileRequestSchema, { part: { case: "data", value: r.value } });
      sent += r.value.length;
      this.opts.onProgress?.(sent);
    }
  }

  /** done ends the watch of opts.signal once the call has ended. */
  done(): void {
    this.stopWaiting.abort();
  }
}

/**
 * BytesUpload is the body of one PUT of the file bytes path: where fetch
 * streams a request (Node.js), src in chunks of CHUNK_SIZE, each reported
 * to onProgress as fetch takes it; in a browser, src whole, reported once
 * sent. The guest writes the file only when the whole body arrived, so when
 * src fails or the caller aborts, the request is cut, and abandoned holds
 * the error the call reports.
 */
class BytesUpload {
  abandoned?: KibotosError;
  private readonly stop: AbortController; // ends the request: the caller's signal, or src failing
  private total = 0;

  constructor(
    private readonly src: Uint8Array | Iterable<Uint8Array> | AsyncIterable<Uint8Array | string>,
    private readonly opts: WriteOptions,
    private readonly streams: boolean,
  ) {
    this.stop = linked(opts.signal);
  }

  /** signal ends the request. */
  get signal(): AbortSignal {
    return this.stop.signal;
  }

  /** body returns the request body. */
  async body(): Promise<Uint8Array | ReadableStream<Uint8Array>> {
    if (!this.streams) {
      const parts: Uint8Array[] = [];
      try {
        for await (const c of chunks(this.src, CHUNK_SIZE)) parts.push(c);
      } catch (e) {
        throw this.fail(e);
      }
      const whole = concat(parts);
      this.total = whole.length;
      return whole;
    }
    const it = chunks(this.src, CHUNK_SIZE)[Symbol.asyncIterator]();
    const aborted = abortion(this.opts.signal, this.stop.signal);
    let sent = 0;
    return new ReadableStream<Uint8Array>(
      {
        pull: async (ctl) => {
          let r: IteratorResult<Uint8Array> | "aborted";
          try {
            r = await Promise.race([it.next(), aborted]);
          } catch (e) {
            ctl.error(this.fail(e));
            return;
          }
          if (r === "aborted") {
            void it.return?.(undefined).catch(() => undefined);
            return; // fetch ends with the signal
          }
          if (r.done) {
            ctl.close();
            return;
          }
          ctl.enqueue(r.value);
          sent += r.value.length;
          this.opts.onProgress?.(sent);
        },
        cancel: () => void it.return?.(undefined).catch(() => undefined),
      },
      { highWaterMark: 0 },
    );
  }

  /** sent reports a whole body sent to onProgress (the browser's). */
  sent(): void {
    if (!this.streams && this.total > 0) this.opts.onProgress?.(this.total);
  }

  /** done records an abort that ended the call, and stops following the caller's signal. */
  done(): void {
    if (this.opts.signal?.aborted && this.abandoned === undefined) {
      this.abandoned = new KibotosError("the upload was aborted", Code.Canceled, { cause: this.opts.signal.reason });
    }
    this.stop.abort();
  }

  /** fail records src's failure and cuts the request. */
  private fail(e: unknown): KibotosError {
    const why = e instanceof Error ? e.message : String(e);
    this.abandoned = new KibotosError(`reading the upload: ${why}`, Code.Unknown, { cause: e });
    this.stop.abort(this.abandoned);
    return this.abandoned;
  }
}

/**
 * abortion resolves to "aborted" when signal aborts, and never when it has
 * none or until aborts first.
 */
function abortion(signal: AbortSignal | undefined, until: AbortSignal): Promise<"aborted"> {
  return new Promise((resolve) => {
    if (signal === undefined) return;
    if (signal.aborted) {
      resolve("aborted");
      return;
    }
    const onAbort = () => resolve("aborted");
    signal.addEventListener("abort", onAbort, { once: true });
    until.addEventListener("abort", () => signal.removeEventListener("abort", onAbort), { once: true });
  });
}

/**
 * linked returns an AbortController that also aborts when parent does; its
 * abort, which ends the call it bounds, detaches it from parent.
 */
function linked(parent?: AbortSignal): AbortController {
  const c = new AbortController();
  if (parent === undefined) return c;
  if (parent.aborted) {
    c.abort(parent.reason);
    return c;
  }
  const follow = () => c.abort(parent.reason);
  parent.addEventListener("abort", follow, { once: true });
  c.signal.addEventListener("abort", () => parent.removeEventListener("abort", follow), { once: true });
  return c;
}
