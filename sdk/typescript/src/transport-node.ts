// The Node.js transports: one HTTP/2 connection per base URL, shared by the
// control plane and the data-plane sessions that point at it.
import type { Transport } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { bearer, cutAsUnavailable, trimSlashes, type Transports } from "./transport.js";

/**
 * NodeTransports holds one Http2SessionManager per base URL: http:// URLs
 * speak HTTP/2 over cleartext with prior knowledge (h2c), https:// ones
 * HTTP/2 over TLS. Uploads are client streams, which need HTTP/2.
 */
export class NodeTransports implements Transports {
  private readonly managers = new Map<string, Http2SessionManager>();
  /** closed aborts on close: the calls then in flight, and any later, are canceled. */
  private readonly closed = new AbortController();
  readonly streamsRequests = true;

  transport(baseUrl: string, token: string, readMaxBytes?: number): Transport {
    baseUrl = trimSlashes(baseUrl);
    let manager = this.managers.get(baseUrl);
    if (manager === undefined) {
      manager = new Http2SessionManager(baseUrl);
      this.managers.set(baseUrl, manager);
    }
    return createConnectTransport({
      baseUrl,
      httpVersion: "2",
      sessionManager: manager,
      interceptors: [bearer(token), cutAsUnavailable(this.closed.signal)],
      readMaxBytes,
    });
  }

  close(): void {
    this.closed.abort(); // first: the calls the aborts end must read canceled
    for (const m of this.managers.values()) m.abort();
    this.managers.clear();
  }
}
