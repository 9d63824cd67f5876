// Transports of the SDK: what the Node.js and the browser entry points
// each provide, and the bearer-token interceptor they share.
import { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";

/**
 * Transports makes the transports of one client: to the control plane,
 * and to the data-plane endpoints its sessions name.
 */
export interface Transports {
  /**
   * transport returns a transport to baseUrl that sends token as a bearer
   * token and, where readMaxBytes is given, refuses a message read over it
   * with Code.ResourceExhausted.
   */
  transport(baseUrl: string, token: string, readMaxBytes?: number): Transport;
  /** close ends the client's calls in flight and closes its connections. */
  close(): void;
  /** streamsRequests is whether fetch can send a stream as a request body (Node.js), not only bytes. */
  readonly streamsRequests: boolean;
}

/** bearer returns an interceptor that sends token as a bearer token. */
export function bearer(token: string): Interceptor {
  return (next) => (req) => {
    req.header.set("Authorization", `Bearer ${token}`);
    return next(req);
  };
}

/**
 * cutAsUnavailable returns an interceptor that reports a call whose
 * connection broke (the server's process died or restarts) as unavailable,
 * the code a caller retries and waitFor rides over: connect-node reads the
 * end of the HTTP/2 session under a call as canceled, which says the caller
 * gave up. A call its caller's signal ended stays canceled, and so does
 * every call once closed has aborted (the client was closed): a new call
 * is then refused before it opens a connection, so that nothing retries
 * on a closed client.
 */
export function cutAsUnavailable(closed: AbortSignal): Interceptor {
  return (next) => async (req) => {
    if (closed.aborted) throw new ConnectError("the client is closed", Code.Canceled);
    const asUnavailable = (e: unknown): unknown => {
      const ce = ConnectError.from(e);
      if (ce.code !== Code.Canceled || req.signal.aborted || closed.aborted) return e;
      return new ConnectError(`the connection broke during the call; retry: ${ce.rawMessage}`, Code.Unavailable, ce.metadata, undefined, e);
    };
    let res: Awaited<ReturnType<typeof next>>;
    try {
      res = await next(req);
    } catch (e) {
      throw asUnavailable(e);
    }
    if (!res.stream) return res;
    const messages = res.message;
    async function* following() {
      try {
        yield* messages;
      } catch (e) {
        throw asUnavailable(e);
      }
    }
    return { ...res, message: following() };
  };
}

/** trimSlashes returns url without its trailing slashes. */
export function trimSlashes(url: string): string {
  return url.replace(/\/+$/, "");
}
