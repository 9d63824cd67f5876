// What both entry points export, but Kibotos, which each makes on its own
// transports.
export { DEFAULT_MEMORY_BYTES, KibotosBase } from "./client.js";
export type { ConnectOptions, CreateWorkspaceOptions, WaitOptions } from "./client.js";
export { Workspace } from "./workspace.js";
export { Process } from "./process.js";
export type { ExecOptions, ExecResult, PtySize } from "./process.js";
export { Files, CHUNK_SIZE } from "./files.js";
export { FILE_BYTES_PATH } from "./filebytes.js";
export type { FileOptions, WriteOptions, DownloadOptions, FileEvent } from "./files.js";
export type { Session } from "./session.js";
export type { Source } from "./bytes.js";
export { KibotosError, WorkspaceStateError } from "./errors.js";
export { Code } from "@connectrpc/connect";
export {
  FailureReason,
  FailureStage,
  WorkspaceState,
  type Workspace as WorkspaceInfo,
} from "../gen/kibotos/ctrl/v1/ctrl_pb.js";
export { FileType, FileEventType, type FileInfo, type ProcessInfo } from "../gen/kibotos/data/v1/data_pb.js";
