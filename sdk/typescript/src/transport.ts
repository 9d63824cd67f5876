// Transports of the SDK: what the Node.js and the browser entry points
// each provide, and the bearer-token interceptor they share.
import type { Interceptor, Transport } from "@connectrpc/connect";

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

/** trimSlashes returns url without its trailing slashes. */
export function trimSlashes(url: string): string {
  return url.replace(/\/+$/, "");
}
