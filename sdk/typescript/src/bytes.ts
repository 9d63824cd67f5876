// Byte sources: what exec's stdin and files.upload accept, cut into the
// chunks the data plane carries.

/**
 * Source is bytes to send: a string (sent as UTF-8), a byte array, or an
 * iterable or async iterable of byte arrays, such as a Node.js Readable
 * stream (fs.createReadStream).
 */
export type Source = string | Uint8Array | Iterable<Uint8Array> | AsyncIterable<Uint8Array | string>;

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
export function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
