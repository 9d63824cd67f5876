// Transports of the SDK: one HTTP/2 connection per base URL, shared by the
// control plane and the data-plane sessions that point at it.
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";

/**
 * Connections holds one Http2SessionManager per base URL: http:// URLs speak
 * HTTP/2 over cleartext with prior knowledge (h2c), https:// ones HTTP/2
 * over TLS. Uploads are client streams, which need HTTP/2.
 */
export class Connections {
  private readonly managers = new Map<string, Http2SessionManager>();

  /** transport returns a transport to baseUrl that sends token as a bearer token. */
  transport(baseUrl: string, token: string): Transport {
    baseUrl = baseUrl.replace(/\/+$/, "");
    let manager = this.managers.get(baseUrl);
    if (manager === undefined) {
      manager = new Http2SessionManager(baseUrl);
      this.managers.set(baseUrl, manager);
    }
    return createConnectTransport({
      baseUrl,
      httpVersion: "2",
      sessionManager: manager,
      interceptors: [bearer(token)],
    });
  }

  /** close closes every connection; calls in flight fail. */
  close(): void {
    for (const m of this.managers.values()) m.abort();
    this.managers.clear();
  }
}

function bearer(token: string): Interceptor {
  return (next) => (req) => {
    req.header.set("Authorization", `Bearer ${token}`);
    return next(req);
  };
}
