// The file bytes path: a file's bytes as a plain HTTP body on a session's
// endpoint, beside FileService's messages. files.download and files.upload
// use it; without message frames it is the bulk path, and a browser can
// send an upload on it, which it cannot as a client stream.
import { fromBinary, fromJson, type JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { type FileInfo, FileInfoSchema, WriteFileResponseSchema } from "../gen/kibotos/data/v1/data_pb.js";
import { errorBody } from "./bounded.js";
import { KibotosError } from "./errors.js";
import type { DataPlane } from "./session.js";

/** FILE_BYTES_PATH is the path of a file's bytes on a session's endpoint: GET reads, PUT writes. */
export const FILE_BYTES_PATH = "/kibotos.data.v1.files";

/** FILE_INFO_HEADER carries a GET's FileInfo, base64 of its protobuf encoding. */
const FILE_INFO_HEADER = "Kibotos-File-Info";

/** NotServed reports a data plane too old to serve FILE_BYTES_PATH. */
export class NotServed extends Error {}

/**
 * servesFileBytes reports whether d's endpoint serves FILE_BYTES_PATH,
 * asking it the first time with a GET that names no file: the path answers
 * invalid_argument, an older data plane 404.
 */
export async function servesFileBytes(d: DataPlane, signal?: AbortSignal): Promise<boolean> {
  if (d.fileBytes === undefined) {
    try {
      const resp = await fileBytes(d, "GET", {}, undefined, signal);
      await resp.body?.cancel();
      throw new KibotosError(`${FILE_BYTES_PATH} answered a GET without a path`, Code.Internal);
    } catch (e) {
      if (e instanceof NotServed) return false;
      if (!(e instanceof ConnectError && e.code === Code.InvalidArgument)) throw e;
      d.fileBytes = true;
    }
  }
  return d.fileBytes;
}

/**
 * fileBytes sends one request of FILE_BYTES_PATH with d's token and returns
 * its response when it succeeded; an error answer is thrown as the
 * ConnectError it carries, a data plane without the path (a 404 that is
 * not a Connect error) as NotServed, a request that got no answer as
 * unavailable.
 */
export async function fileBytes(
  d: DataPlane,
  method: "GET" | "PUT",
  query: Record<string, string>,
  body?: Uint8Array | ReadableStream<Uint8Array>,
  signal?: AbortSignal,
): Promise<Response> {
  const init: RequestInit & { duplex?: "half" } = {
    method,
    headers: { Authorization: `Bearer ${d.session.token}`, "Content-Type": "application/octet-stream" },
    body,
    signal,
  };
  if (body instanceof ReadableStream) init.duplex = "half";
  let resp: Response;
  try {
    resp = await fetch(`${d.session.endpoint.replace(/\/+$/, "")}${FILE_BYTES_PATH}?${new URLSearchParams(query)}`, init);
  } catch (e) {
    if (signal?.aborted) throw e;
    // A request that failed on its way tells nothing of the path: only an
    // answer does (a 404 below), and a retry may get one.
    throw new ConnectError(`the data plane did not answer: ${e instanceof Error ? e.message : String(e)}`, Code.Unavailable, undefined, undefined, e);
  }
  if (resp.ok) {
    d.fileBytes = true;
    return resp;
  }
  const bytes = await errorBody(resp);
  const json = (resp.headers.get("Content-Type") ?? "").startsWith("application/json");
  if (resp.status === 404 && !json) {
    d.fileBytes = false;
    throw new NotServed();
  }
  const fallback = new ConnectError(`HTTP ${resp.status}: ${new TextDecoder().decode(bytes).trim()}`, Code.Unknown);
  throw json ? errorFromJsonBytes(bytes, resp.headers, fallback) : fallback;
}

/** fileInfoOf returns the FileInfo a GET's response carries, if any. */
export function fileInfoOf(resp: Response): FileInfo | undefined {
  const header = resp.headers.get(FILE_INFO_HEADER);
  if (!header) return undefined;
  try {
    return fromBinary(FileInfoSchema, Uint8Array.from(atob(header), (c) => c.charCodeAt(0)));
  } catch {
    return undefined;
  }
}

/** writtenFileOf returns the FileInfo of a PUT's answer. */
export async function writtenFileOf(resp: Response): Promise<FileInfo> {
  const answer = fromJson(WriteFileResponseSchema, (await resp.json()) as JsonValue, { ignoreUnknownFields: true });
  return answer.file!;
}
