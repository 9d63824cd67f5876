// A file's bytes as a plain HTTP body on the data plane's file bytes path:
// a GET reads a file, a PUT writes one (all or nothing: the guest renames
// it into place only once the whole body arrived). XMLHttpRequest sends the
// PUT, whose upload events give the progress; fetch cannot report it.
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeFromHttpStatus, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { type FileInfo, WriteFileResponseSchema } from "../../sdk/typescript/gen/kibotos/data/v1/data_pb.js";
import type { DataPlane } from "./api.js";

/** FILE_BYTES_PATH is the path of a file's bytes on a session's endpoint. */
const FILE_BYTES_PATH = "/kibotos.data.v1.files";

function fileURL(p: DataPlane, path: string): string {
  return `${p.endpoint.replace(/\/+$/, "")}${FILE_BYTES_PATH}?${new URLSearchParams({ path })}`;
}

/** answerError is the ConnectError an error answer carries (JSON), or one of its HTTP status. */
function answerError(status: number, body: Uint8Array): ConnectError {
  return errorFromJsonBytes(body, undefined, new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status)));
}

/** getFile reads the file at path. */
export async function getFile(p: DataPlane, path: string, signal?: AbortSignal): Promise<Blob> {
  const resp = await fetch(fileURL(p, path), { headers: { Authorization: `Bearer ${p.token}` }, signal });
  if (!resp.ok) throw answerError(resp.status, new Uint8Array(await resp.arrayBuffer()));
  return resp.blob();
}

/** putFile writes file to path, calling onProgress with the bytes sent so far. */
export function putFile(
  p: DataPlane, path: string, file: Blob, onProgress: (sent: number) => void, signal?: AbortSignal,
): Promise<FileInfo> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", fileURL(p, path));
    xhr.responseType = "arraybuffer";
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("Authorization", `Bearer ${p.token}`);
    xhr.upload.onprogress = (e) => onProgress(e.loaded);
    xhr.onerror = () => reject(new ConnectError("the upload failed on the network", Code.Unavailable));
    xhr.onabort = () => reject(new ConnectError("the upload was canceled", Code.Canceled));
    signal?.addEventListener("abort", () => xhr.abort());
    xhr.onload = () => {
      const body = new Uint8Array(xhr.response as ArrayBuffer);
      if (xhr.status !== 200) {
        reject(answerError(xhr.status, body));
        return;
      }
      try {
        const answer = JSON.parse(new TextDecoder().decode(body)) as JsonValue;
        resolve(fromJson(WriteFileResponseSchema, answer, { ignoreUnknownFields: true }).file!);
      } catch (e) {
        reject(new ConnectError(`the answer of the upload: ${String(e)}`, Code.Internal));
      }
    };
    xhr.send(file);
  });
}
