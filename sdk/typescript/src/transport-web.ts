// The browser transports: connect-web over the fetch API.
import { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { boundedFetch } from "./bounded.js";
import { bearer, trimSlashes, type Transports } from "./transport.js";

/**
 * WebTransports calls over the fetch API (connect-web), as a browser does,
 * or Node.js's own fetch. fetch streams responses but not requests: unary
 * and server-streaming calls work, a client stream (WriteFile, which
 * files.write and files.upload use only on a data plane without the file
 * bytes path) rejects with Code.Unimplemented. A call ends with its signal.
 */
export class WebTransports implements Transports {
  readonly streamsRequests = false;

  transport(baseUrl: string, token: string, readMaxBytes?: number): Transport {
    return createConnectTransport({
      baseUrl: trimSlashes(baseUrl),
      interceptors: [requestStreamsRefused, bearer(token)],
      fetch: readMaxBytes === undefined ? undefined : boundedFetch(readMaxBytes),
    });
  }

  /** close does nothing: fetch keeps no connection a client could close. */
  close(): void {}
}

/** requestStreamsRefused rejects a call that streams its request, which fetch cannot send. */
const requestStreamsRefused: Interceptor = (next) => (req) => {
  if (req.stream && req.method.methodKind !== "server_streaming") {
    throw new ConnectError(
      `${req.method.name} streams its request, which the fetch API cannot: use the SDK's Node.js entry point (@kibotos/sdk)`,
      Code.Unimplemented,
    );
  }
  return next(req);
};

