// Byte sources: what exec's stdin and files.upload accept, cut into the
// chunks the data plane carries.

/**
 * Source is bytes to send: a string (sent as UTF-8), a byte array, or an
 * iterable or async iterable of byte arrays, such as a Node.js Readable
 * stream (fs.createReadStream).
 */
export type Source = string | Uint8Array | Iterable<Uint8Array> | AsyncIterable<Uint8Array | string>;

/**
 * taken is src as a call holds it, from the moment the call takes it until
 * until aborts (the call ended). A Node.js stream (any source with an
 * 'error' event) is listened to at once, and what it emitted is thrown at
 * the first read. The SDK reads a source only once the call has begun its
 * work (a session issued, the process started), and a stream that fails
 * before then (fs.createReadStream of a file that does not exist) would
 * otherwise emit 'error' with no listener, which throws out of the
 * caller's process. Every call that takes a Source passes it through taken
 * first, before it awaits anything, and aborts until when it ends.
 *
 * The stream stays the caller's, to give to the next call: once until
 * aborts, nothing of the SDK's is left on it (its 'error' events are the
 * caller's again), and it is never destroyed. A Readable is read with
 * read() as it says it has data, so a read waiting for data when until
 * aborts takes nothing, and what the call did not read stays in the stream.
 * A read after until aborted rejects: the call's end is not the stream's.
 * Other sources are returned as they are; whoever reads them closes their
 * iterator (return) when it stops early.
 */
export function taken(src: Exclude<Source, string>, until: AbortSignal): Exclude<Source, string> {
  if (src instanceof Uint8Array || !isEmitter(src)) return src;
  const stream = src;
  let failure: { error: unknown } | undefined;
  let wake = () => {}; // ends the wait of the read under way
  const onError = (error: unknown) => {
    failure ??= { error };
    wake();
  };
  const onChange = () => wake();
  stream.on("error", onError);
  const release = () => {
    stream.off("error", onError);
    for (const event of CHANGES) stream.off(event, onChange);
    wake();
  };
  if (until.aborted) release();
  else until.addEventListener("abort", release, { once: true });

  // check throws what ends reading: the call's end, or the stream's failure.
  const check = () => {
    if (until.aborted) throw new Error("the call that took the stream has ended");
    if (failure !== undefined) throw failure.error;
  };

  async function* read(): AsyncGenerator<Uint8Array | string> {
    check();
    if (!isReadable(stream)) {
      yield* stream as unknown as AsyncIterable<Uint8Array | string>;
      return;
    }
    // Not the stream's own async iterator: it destroys the stream when
    // ended early and, with destroyOnReturn false, still reads one chunk
    // for a next() waiting when it is ended, which no one would then get.
    for (const event of CHANGES) stream.on(event, onChange);
    try {
      for (;;) {
        check();
        const chunk = stream.destroyed ? null : stream.read();
        if (chunk !== null) {
          yield chunk;
          continue;
        }
        if (stream.readableEnded) return;
        if (stream.destroyed) throw stream.errored ?? new Error("the stream was destroyed before its end");
        await new Promise<void>((resolve) => (wake = resolve));
      }
    } finally {
      wake = () => {};
      for (const event of CHANGES) stream.off(event, onChange);
    }
  }
  return { [Symbol.asyncIterator]: read };
}

/** CHANGES are the events of a Readable after which read() may return something new, or the stream has ended. */
const CHANGES = ["readable", "end", "close"] as const;

/** Emitter is a source that emits events, as a Node.js stream does. */
interface Emitter {
  on(event: string, listener: (...args: never[]) => void): unknown;
  off(event: string, listener: (...args: never[]) => void): unknown;
}

/** isEmitter reports whether src emits events, as a Node.js stream does. */
function isEmitter(src: object): src is object & Emitter {
  const s = src as { on?: unknown; off?: unknown };
  return typeof s.on === "function" && typeof s.off === "function";
}

/** ReadableLike is what taken uses of a Node.js Readable. */
interface ReadableLike extends Emitter {
  read(): Uint8Array | string | null;
  readonly readableEnded: boolean;
  readonly destroyed: boolean;
  readonly errored?: unknown;
}

/** isReadable reports whether src is a Node.js Readable (or Duplex), read with read(). */
function isReadable(src: Emitter): src is ReadableLike {
  const s = src as { read?: unknown; readableEnded?: unknown; destroyed?: unknown };
  return typeof s.read === "function" && typeof s.readableEnded === "boolean" && typeof s.destroyed === "boolean";
}

/** bytesOf returns data as bytes, encoding a string as UTF-8. */
export function bytesOf(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? new TextEncoder().encode(data) : data;
}

/**
 * chunks yields the bytes of src in chunks of max bytes, the last one
 * shorter; small pieces of an iterable are gathered into full chunks.
 */
export async function* chunks(src: Source, max: number): AsyncGenerator<Uint8Array> {
  if (typeof src === "string" || src instanceof Uint8Array) {
    yield* split(bytesOf(src), max);
    return;
  }
  let pending: Uint8Array[] = [];
  let size = 0;
  for await (const piece of src as AsyncIterable<Uint8Array | string>) {
    let b = bytesOf(piece);
    while (size + b.length >= max) {
      const take = max - size;
      pending.push(b.subarray(0, take));
      yield concat(pending);
      b = b.subarray(take);
      pending = [];
      size = 0;
    }
    if (b.length > 0) {
      pending.push(b);
      size += b.length;
    }
  }
  if (size > 0) yield concat(pending);
}

/**
 * pieces yields the bytes of src as they come: each piece of an iterable
 * as soon as it arrives, cut into parts of at most max bytes, never
 * gathered with the next, so that a process reading its input line by
 * line gets each line when the source yields it.
 */
export async function* pieces(src: Source, max: number): AsyncGenerator<Uint8Array> {
  if (typeof src === "string" || src instanceof Uint8Array) {
    yield* split(bytesOf(src), max);
    return;
  }
  for await (const piece of src as AsyncIterable<Uint8Array | string>) yield* split(bytesOf(piece), max);
}

/** split yields b in parts of at most max bytes (none when b is empty). */
function* split(b: Uint8Array, max: number): Generator<Uint8Array> {
  for (let i = 0; i < b.length; i += max) yield b.subarray(i, i + max);
}

/** concat returns the bytes of parts, one after the other. */
/**
 * Rereadable reads a streamed source once for the several attempts of one
 * upload (a first one refused for its session, then one with a new
 * session): each attempt reads the chunks the earlier ones read, held in
 * memory up to bound bytes, then the rest of the source. An attempt that
 * ends early leaves the source open; close ends it.
 */
export class Rereadable {
  private readonly source: AsyncIterator<Uint8Array>;
  private held: Uint8Array[] = [];
  private heldBytes = 0;
  private overflowed = false;
  private reading: Promise<unknown> = Promise.resolve();
  private attempts = 0;
  private ended = false; // the source ended
  private failure?: { error: unknown }; // the source failed

  constructor(
    src: Source,
    chunkSize: number,
    private readonly bound: number,
  ) {
    this.source = chunks(src, chunkSize)[Symbol.asyncIterator]();
  }

  /**
   * restart ends the current attempt, which reads no more of the source
   * from now on (a failed call's body may still be pulled), and resolves,
   * once its last read has ended, to whether a new attempt can read the
   * source from its start: all that was read is held. It rejects with the
   * source's error when the source failed, and with signal's reason when
   * signal aborts first.
   */
  async restart(signal?: AbortSignal): Promise<boolean> {
    this.attempts++;
    await settled(this.reading, signal);
    if (this.failure !== undefined) throw this.failure.error;
    return !this.overflowed;
  }

  /** attempt is one attempt's reading of the source, from its start; the attempts before it read no more. */
  attempt(): AsyncIterable<Uint8Array> {
    const attempt = ++this.attempts;
    let at = 0; // the next chunk's index in the source
    const next = (): Promise<IteratorResult<Uint8Array>> => {
      if (attempt !== this.attempts) return Promise.reject(new Error("the upload is being sent again"));
      // One read of the source at a time: what an attempt that ended
      // left reading is held before the next attempt looks.
      const r = this.reading.then(async (): Promise<IteratorResult<Uint8Array>> => {
        if (at < this.held.length) return { value: this.held[at++], done: false };
        // The source's end and failure stay theirs: a source read again
        // after either need not say so again.
        if (this.failure !== undefined) throw this.failure.error;
        if (this.ended) return { value: undefined, done: true };
        let r: IteratorResult<Uint8Array>;
        try {
          r = await this.source.next();
        } catch (error) {
          this.failure = { error };
          throw error;
        }
        if (r.done) {
          this.ended = true;
          return r;
        }
        at++;
        this.hold(r.value);
        return r;
      });
      this.reading = r.catch(() => undefined);
      return r;
    };
    const it: AsyncIterableIterator<Uint8Array> = {
      next,
      return: async () => ({ value: undefined, done: true }),
      [Symbol.asyncIterator]: () => it,
    };
    return it;
  }

  private hold(chunk: Uint8Array): void {
    if (this.overflowed) return;
    this.heldBytes += chunk.length;
    if (this.heldBytes > this.bound) {
      this.overflowed = true;
      this.held = [];
      return;
    }
    this.held.push(chunk);
  }

  /** close ends the source. */
  close(): void {
    void this.source.return?.(undefined).catch(() => undefined);
  }
}

/** settled resolves once p has settled, or rejects with signal's reason when it aborts first. */
function settled(p: Promise<unknown>, signal?: AbortSignal): Promise<void> {
  if (signal === undefined) return p.then(() => undefined, () => undefined);
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const abort = () => reject(signal.reason);
    signal.addEventListener("abort", abort, { once: true });
    const done = () => {
      signal.removeEventListener("abort", abort);
      resolve();
    };
    p.then(done, done);
  });
}

export function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
