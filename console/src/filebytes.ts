// A file's bytes as a plain HTTP body on the data plane's file bytes path:
// a GET reads a file, a PUT writes one (all or nothing: the guest renames
// it into place only once the whole body arrived). The PUT goes through
// upload.ts's send, whose progress fetch cannot report.
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { type FileInfo, WriteFileResponseSchema } from "../../sdk/typescript/gen/kibotos/data/v1/data_pb.js";
import { errorBody } from "../../sdk/typescript/src/bounded.js";
import type { DataPlane } from "./api.js";
import { answerError, send } from "./upload.js";

/** FILE_BYTES_PATH is the path of a file's bytes on a session's endpoint. */
const FILE_BYTES_PATH = "/kibotos.data.v1.files";

function fileURL(p: DataPlane, path: string): string {
  return `${p.endpoint.replace(/\/+$/, "")}${FILE_BYTES_PATH}?${new URLSearchParams({ path })}`;
}

/** getFile reads the file at path. */
export async function getFile(p: DataPlane, path: string, signal?: AbortSignal): Promise<Blob> {
  const resp = await fetch(fileURL(p, path), { headers: { Authorization: `Bearer ${p.token}` }, signal });
  if (!resp.ok) throw answerError(resp.status, await errorBody(resp));
  return resp.blob();
}

/** putFile writes file to path, calling onProgress with the bytes sent so far. */
export async function putFile(
  p: DataPlane, path: string, file: Blob, onProgress: (sent: number) => void, signal?: AbortSignal,
): Promise<FileInfo> {
  const answer = await send("PUT", fileURL(p, path),
    { "Content-Type": "application/octet-stream", Authorization: `Bearer ${p.token}` }, file, onProgress, signal);
  try {
    const json = JSON.parse(new TextDecoder().decode(answer)) as JsonValue;
    return fromJson(WriteFileResponseSchema, json, { ignoreUnknownFields: true }).file!;
  } catch (e) {
    throw new ConnectError(`the answer of the upload: ${String(e)}`, Code.Internal);
  }
}
