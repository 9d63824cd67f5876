// Uploads from the browser with progress. fetch cannot report an upload's
// progress, nor stream a request body: send sends a body with
// XMLHttpRequest, whose upload events give the progress. A client stream
// (connect-web refuses them) can arrive as one body of enveloped messages:
// upload builds that body as a Blob (file slices are not read into memory)
// and reads the response (one message, then the end of the stream) with
// connect's own protocol functions.
import { fromBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeFromHttpStatus, endStreamFromJson, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { maxDataPlaneMessage } from "../../sdk/typescript/src/bounded.js";

/** CHUNK is the size of one data message. */
export const CHUNK = 1 << 20;

/** envelope frames one message: flags, 4-byte big-endian length, bytes. */
function envelope(data: Uint8Array, flags = 0): Uint8Array {
  const out = new Uint8Array(5 + data.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, data.length);
  out.set(data, 5);
  return out;
}

/** header is the envelope header of a message of n bytes. */
function header(n: number): Uint8Array {
  const out = new Uint8Array(5);
  new DataView(out.buffer).setUint32(1, n);
  return out;
}

/**
 * Part is one request message: encoded bytes, or a slice of a Blob that is
 * the only field of a message (dataField, length-delimited) whose framing
 * is written around it.
 */
export type Part = Uint8Array | { blob: Blob; fieldNumber: number };

/** varint encodes n as a protobuf varint. */
function varint(n: number): number[] {
  const out: number[] = [];
  while (n > 127) {
    out.push((n & 127) | 128);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

/** body builds the request body of a client stream from its parts. */
function body(parts: Part[]): Blob {
  const blobs: BlobPart[] = [];
  for (const p of parts) {
    if (p instanceof Uint8Array) {
      blobs.push(envelope(p) as BlobPart);
      continue;
    }
    // field tag (wire type 2), length, then the bytes themselves
    const prefix = new Uint8Array([...varint((p.fieldNumber << 3) | 2), ...varint(p.blob.size)]);
    blobs.push(header(prefix.length + p.blob.size) as BlobPart, prefix as BlobPart, p.blob);
  }
  return new Blob(blobs);
}

/** chunks splits a blob into data parts of CHUNK bytes for field fieldNumber. */
export function chunks(blob: Blob, fieldNumber: number): Part[] {
  const out: Part[] = [];
  for (let off = 0; off < blob.size; off += CHUNK) out.push({ blob: blob.slice(off, off + CHUNK), fieldNumber });
  return out;
}

/** answerError is the ConnectError an error answer carries (JSON), or one of its HTTP status. */
export function answerError(status: number, body: Uint8Array): ConnectError {
  return errorFromJsonBytes(body, undefined, new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status)));
}

/**
 * send sends body to url with XMLHttpRequest and resolves with the answer's
 * body when its status is 200; another status rejects with answerError.
 * onProgress gets the bytes sent so far and the total.
 */
export function send(
  method: string, url: string, headers: Record<string, string>, body: Blob,
  onProgress: (sent: number, total: number) => void, signal?: AbortSignal,
): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, url);
    xhr.responseType = "arraybuffer";
    for (const [k, v] of Object.entries(headers)) xhr.setRequestHeader(k, v);
    xhr.upload.onprogress = (e) => onProgress(e.loaded, e.total);
    // The answer comes from a guest (a file's write) or the server: it is
    // read up to the SDK's bound on a data-plane message.
    let tooLarge = false;
    xhr.onprogress = (e) => {
      if (e.loaded > maxDataPlaneMessage) {
        tooLarge = true;
        xhr.abort();
      }
    };
    xhr.onerror = () => reject(new ConnectError("the upload failed on the network", Code.Unavailable));
    xhr.onabort = () => reject(tooLarge
      ? new ConnectError(`the answer is larger than ${maxDataPlaneMessage} bytes`, Code.ResourceExhausted)
      : new ConnectError("the upload was canceled", Code.Canceled));
    signal?.addEventListener("abort", () => xhr.abort());
    xhr.onload = () => {
      const buf = new Uint8Array(xhr.response as ArrayBuffer);
      if (xhr.status === 200) resolve(buf);
      else reject(answerError(xhr.status, buf));
    };
    xhr.send(body);
  });
}

/** upload calls a client-streaming method at baseUrl/service/method and returns its response. */
export async function upload<O extends DescMessage>(
  url: string, token: string, parts: Part[], output: O, onProgress: (sent: number, total: number) => void, signal?: AbortSignal,
): Promise<MessageShape<O>> {
  const buf = await send("POST", url, {
    "Content-Type": "application/connect+proto",
    "Connect-Protocol-Version": "1",
    Authorization: `Bearer ${token}`,
  }, body(parts), onProgress, signal);
  let msg: MessageShape<O> | undefined;
  for (let off = 0; off + 5 <= buf.length;) {
    const flags = buf[off];
    const n = new DataView(buf.buffer, buf.byteOffset + off + 1, 4).getUint32(0);
    const data = buf.subarray(off + 5, off + 5 + n);
    off += 5 + n;
    if (flags & 2) {
      const end = endStreamFromJson(data);
      if (end.error) throw end.error;
      if (msg) return msg;
      throw new ConnectError("the response had no message", Code.Internal);
    }
    msg = fromBinary(output, data);
  }
  throw new ConnectError("the response ended without its end", Code.Internal);
}
