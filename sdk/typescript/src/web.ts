/**
 * @kibotos/sdk/web is the TypeScript client of Kibotos for browsers: the
 * same surface as @kibotos/sdk, over the fetch API (connect-web), with no
 * import of Node.js. fetch cannot stream a request, so files.write and
 * files.upload send a file whole, as the body of a PUT of the file bytes
 * path; everything else works, exec and watch streaming their responses. A
 * page calls a deployment on its own origin, as the web console does, or
 * one that allows it (CORS).
 *
 * ```ts
 * import { Kibotos } from "@kibotos/sdk/web";
 * const kb = Kibotos.connect({ url: location.origin, token });
 * ```
 *
 * @module
 */
import { type ConnectOptions, KibotosBase } from "./client.js";
import { WebTransports } from "./transport-web.js";

export * from "./common.js";

/** Kibotos calls one control plane with an API token, over the fetch API. */
export class Kibotos extends KibotosBase {
  constructor(opts: ConnectOptions) {
    super(opts, new WebTransports());
  }

  /** connect returns a client of the control plane at url that authenticates with token. */
  static connect(opts: ConnectOptions): Kibotos {
    return new Kibotos(opts);
  }
}
