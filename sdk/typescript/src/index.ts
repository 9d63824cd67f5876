/**
 * @kibotos/sdk is the TypeScript client of Kibotos: it creates Workspaces
 * on a control plane, and runs processes and moves files in them through
 * their data plane. This entry point is for Node.js (HTTP/2, every call);
 * @kibotos/sdk/web is the browser's (the fetch API).
 *
 * ```ts
 * const kb = Kibotos.connect({ url: "http://127.0.0.1:8870", token });
 * const ws = await kb.createWorkspace();
 * const { exitCode, stdout } = await ws.exec(["uname", "-a"]);
 * ```
 *
 * @module
 */
import { type ConnectOptions, KibotosBase } from "./client.js";
import { NodeTransports } from "./transport-node.js";

export * from "./common.js";

/**
 * Kibotos calls one control plane with an API token, over one HTTP/2
 * connection per base URL (h2c for http://).
 */
export class Kibotos extends KibotosBase {
  constructor(opts: ConnectOptions) {
    super(opts, new NodeTransports());
  }

  /** connect returns a client of the control plane at url that authenticates with token. */
  static connect(opts: ConnectOptions): Kibotos {
    return new Kibotos(opts);
  }
}
