// Errors of the SDK: every call rejects with a KibotosError, which carries
// the Connect code of the failure and, when the server sent one, the
// reason and stage of its kibotos.ctrl.v1.ErrorDetail.
import { Code, ConnectError } from "@connectrpc/connect";
import {
  ErrorDetailSchema,
  FailureReason,
  FailureStage,
  WorkspaceState,
  type Workspace as WorkspaceInfo,
} from "../gen/kibotos/ctrl/v1/ctrl_pb.js";

/**
 * KibotosError is what every call of the SDK rejects with. `code` is the
 * canonical Connect code (compare with `Code.NotFound`, ...); `reason` and
 * `stage` come from the ErrorDetail the server attached; without one,
 * `reason` is the one the code implies and `stage` UNSPECIFIED.
 * `observedWorkspace` is the Workspace as the server saw it when a
 * precondition failed.
 */
export class KibotosError extends Error {
  override name = "KibotosError";
  readonly code: Code;
  readonly reason: FailureReason;
  readonly stage: FailureStage;
  readonly observedWorkspace?: WorkspaceInfo;

  constructor(
    message: string,
    code: Code,
    opts: { reason?: FailureReason; stage?: FailureStage; observedWorkspace?: WorkspaceInfo; cause?: unknown } = {},
  ) {
    super(message, { cause: opts.cause });
    this.code = code;
    this.reason = opts.reason ?? reasonOf(code);
    this.stage = opts.stage ?? FailureStage.UNSPECIFIED;
    this.observedWorkspace = opts.observedWorkspace;
  }

  /** codeName is the code as the Connect protocol spells it, e.g. "not_found". */
  get codeName(): string {
    return codeName(this.code);
  }

  /** reasonName is the reason without its prefix, e.g. "NOT_FOUND". */
  get reasonName(): string {
    return FailureReason[this.reason];
  }

  /** stageName is the stage without its prefix, e.g. "READING_FILE". */
  get stageName(): string {
    return FailureStage[this.stage];
  }
}

/**
 * WorkspaceStateError reports that a Workspace a call waited for reached a
 * state from which it will not get to the one the call wanted: FAILED, whose
 * reason and stage it carries, or another, such as STOPPED while waiting
 * for AVAILABLE. Its code is failed_precondition.
 */
export class WorkspaceStateError extends KibotosError {
  override name = "WorkspaceStateError";
  /** workspace is the Workspace as last observed. */
  readonly workspace: WorkspaceInfo;
  /** want is the state the call waited for. */
  readonly want: WorkspaceState;

  constructor(workspace: WorkspaceInfo, want: WorkspaceState) {
    const f = workspace.failure;
    let msg: string;
    if (workspace.state !== WorkspaceState.FAILED) {
      msg = `workspace ${workspace.workspaceId} is ${WorkspaceState[workspace.state]} and will not become ${WorkspaceState[want]}`;
    } else {
      msg = `workspace ${workspace.workspaceId} FAILED: ${FailureReason[f?.reason ?? 0]}`;
      if (f?.stage) msg += ` at stage ${FailureStage[f.stage]}`;
      if (f?.message) msg += `: ${f.message}`;
    }
    super(msg, Code.FailedPrecondition, { reason: f?.reason, stage: f?.stage, observedWorkspace: workspace });
    this.workspace = workspace;
    this.want = want;
  }
}

/**
 * reasonOf is the reason a Connect code implies, as the server gives a
 * refusal that names none (sdk/failure in Go); a refusal that came with no
 * ErrorDetail at all (made before the server's handlers, such as of a
 * request too large to read, or by the SDK itself) gets it here.
 * failed_precondition implies none.
 */
function reasonOf(code: Code): FailureReason {
  switch (code) {
    case Code.InvalidArgument:
    case Code.OutOfRange:
      return FailureReason.INVALID_REQUEST;
    case Code.NotFound:
      return FailureReason.NOT_FOUND;
    case Code.AlreadyExists:
    case Code.Aborted:
      return FailureReason.CONFLICT;
    case Code.ResourceExhausted:
      return FailureReason.RESOURCE_EXHAUSTED;
    case Code.Unauthenticated:
      return FailureReason.UNAUTHENTICATED;
    case Code.PermissionDenied:
      return FailureReason.PERMISSION_DENIED;
    case Code.Unavailable:
      return FailureReason.UNAVAILABLE;
    case Code.DeadlineExceeded:
      return FailureReason.TIMED_OUT;
    case Code.Unimplemented:
      return FailureReason.UNSUPPORTED;
    case Code.Canceled:
      return FailureReason.CANCELLED;
    case Code.Internal:
    case Code.DataLoss:
    case Code.Unknown:
      return FailureReason.INTERNAL;
  }
  return FailureReason.UNSPECIFIED;
}

/**
 * toKibotosError turns what a Connect call threw into a KibotosError,
 * reading the ErrorDetail among the error's details. A KibotosError is
 * returned as it is; anything else becomes one with code unknown.
 */
export function toKibotosError(err: unknown): KibotosError {
  if (err instanceof KibotosError) return err;
  const ce = ConnectError.from(err);
  const [detail] = ce.findDetails(ErrorDetailSchema);
  return new KibotosError(ce.message, ce.code, {
    reason: detail?.reason,
    stage: detail?.stage,
    observedWorkspace: detail?.observedWorkspace,
    cause: err,
  });
}

/** wrap awaits p and rethrows its failure as a KibotosError. */
export async function wrap<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    throw toKibotosError(err);
  }
}

/**
 * sessionRefused reports whether err means a new session would cure it:
 * the data plane refused the session as expired, or as not valid for the
 * workspace's execution (of an earlier start: a handle outlives a stop and
 * start; or rotated). A revoked session stays revoked: its revoker meant it.
 */
export function sessionRefused(err: KibotosError): boolean {
  return (
    err.reason === FailureReason.SESSION_EXPIRED ||
    (err.code === Code.Unauthenticated &&
      err.stage === FailureStage.AUTHORIZING_DATA_PLANE &&
      err.reason !== FailureReason.SESSION_REVOKED)
  );
}

/**
 * notReached reports whether err means its call never reached the server:
 * no connection could be made (refused, no route, a name that does not
 * resolve), as while the deployment restarts. An unavailable the server
 * answered (the workspace is not running) is not.
 */
export function notReached(err: unknown): boolean {
  const seen = new Set<unknown>();
  for (let e = err; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    const { syscall } = e as { syscall?: unknown };
    if (syscall === "connect" || syscall === "getaddrinfo") return true;
  }
  return false;
}

function codeName(code: Code): string {
  return (Code[code] ?? "unknown").replace(/[A-Z]/g, (c, i: number) => (i > 0 ? "_" : "") + c.toLowerCase());
}
