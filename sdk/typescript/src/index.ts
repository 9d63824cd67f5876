/**
 * @kibotos/sdk is the TypeScript client of Kibotos: it creates Workspaces
 * on a control plane, and runs processes and moves files in them through
 * their data plane.
 *
 * ```ts
 * const kb = Kibotos.connect({ url: "http://127.0.0.1:8870", token });
 * const ws = await kb.createWorkspace();
 * const { exitCode, stdout } = await ws.exec(["uname", "-a"]);
 * ```
 *
 * @module
 */
export { Kibotos, DEFAULT_MEMORY_BYTES } from "./client.js";
export type { ConnectOptions, CreateWorkspaceOptions, WaitOptions } from "./client.js";
export { Workspace } from "./workspace.js";
export { Process } from "./process.js";
export type { ExecOptions, ExecResult, PtySize } from "./process.js";
export { Files, CHUNK_SIZE } from "./files.js";
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
