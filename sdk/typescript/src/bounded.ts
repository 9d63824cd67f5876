// Bounds on what the SDK reads from a data plane, whose answers a guest
// shapes: shared by the Node.js and browser entry points and by the web
// console, which reads the data plane over fetch too.
import { Code, ConnectError } from "@connectrpc/connect";

/**
 * maxDataPlaneMessage bounds a message read from the data plane: what a
 * guest answers is not trusted, and a message without end would take the
 * caller's memory.
 */
export const maxDataPlaneMessage = 64 << 20;

/** maxErrorBody bounds the body of an error answer that is read for its message. */
export const maxErrorBody = 64 << 10;

/**
 * boundedFetch returns a fetch whose answers carry no message over max
 * bytes (connect-web, unlike connect-node, takes no readMaxBytes): a
 * stream's envelope that declares more, or a unary answer's body that
 * grows past it, errors the body with Code.ResourceExhausted before it is
 * read further.
 */
export function boundedFetch(max: number): typeof fetch {
  return async (input, init) => {
    const res = await fetch(input, init);
    if (res.body === null) return res;
    const enveloped = (res.headers.get("Content-Type") ?? "").startsWith("application/connect+");
    return new Response(res.body.pipeThrough(messageBound(max, enveloped)), {
      status: res.status,
      statusText: res.statusText,
      headers: res.headers,
    });
  };
}

/**
 * messageBound passes a body through while its messages stay within max
 * bytes: each envelope of a stream (a flags byte, then its length as 4
 * bytes big-endian) or, unenveloped, the whole body.
 */
function messageBound(max: number, enveloped: boolean): TransformStream<Uint8Array, Uint8Array> {
  const tooLarge = (n: number) =>
    new ConnectError(`message of ${n} bytes is larger than the configured readMaxBytes ${max}`, Code.ResourceExhausted);
  let total = 0; // unenveloped: the body's bytes so far
  let prefix = 0; // enveloped: the bytes of the next envelope's prefix read so far
  let length = 0; // its length, as far as read
  let left = 0; // the bytes of the current envelope's message still to come
  return new TransformStream({
    transform(chunk, controller) {
      if (!enveloped) {
        total += chunk.length;
        if (total > max) throw tooLarge(total);
      }
      for (let i = 0; enveloped && i < chunk.length; ) {
        if (left > 0) {
          const n = Math.min(left, chunk.length - i);
          left -= n;
          i += n;
          continue;
        }
        if (prefix > 0) length = length * 256 + chunk[i]; // the flags byte is prefix 0
        i++;
        if (++prefix === 5) {
          if (length > max) throw tooLarge(length);
          left = length;
          prefix = length = 0;
        }
      }
      controller.enqueue(chunk);
    },
  });
}

/**
 * errorBody reads at most maxErrorBody bytes of resp's body, an error
 * answer read for its message, and cancels the rest.
 */
export async function errorBody(resp: Response): Promise<Uint8Array> {
  const out = new Uint8Array(maxErrorBody);
  let n = 0;
  const reader = resp.body?.getReader();
  if (reader === undefined) return out.subarray(0, 0);
  try {
    while (n < maxErrorBody) {
      const { done, value } = await reader.read();
      if (done) break;
      const take = Math.min(value.length, maxErrorBody - n);
      out.set(value.subarray(0, take), n);
      n += take;
    }
  } finally {
    reader.cancel().catch(() => undefined);
  }
  return out.subarray(0, n);
}
