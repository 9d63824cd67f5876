// A data plane whose guest agent was replaced may answer anything: a
// message over the SDK's bound is refused with Code.ResourceExhausted
// before it is read whole, by the Node.js client (connect-node's
// readMaxBytes) and by the browser's (over fetch, which has none of its
// own), on an in-process fake of the control and data plane.
import assert from "node:assert/strict";
import * as http from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { create, toBinary, toJsonString } from "@bufbuild/protobuf";
import { Code, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { SessionService, WorkspaceService, WorkspaceState } from "../gen/kibotos/ctrl/v1/ctrl_pb.js";
import {
  type ProcessEvent,
  ProcessEvent_ExitedSchema,
  ProcessEvent_StartedSchema,
  ProcessEventSchema,
  ProcessService,
} from "../gen/kibotos/data/v1/data_pb.js";
import { Kibotos, KibotosError } from "../src/index.js";
import { maxDataPlaneMessage, maxErrorBody } from "../src/bounded.js";
import { Kibotos as WebKibotos } from "../src/web.js";

/** huge is a unary answer's payload over the bound; small, a message's within it. */
const huge = "a".repeat(maxDataPlaneMessage + 1);
const small = new Uint8Array(1 << 20).fill(98);

/**
 * startEnds is how the next StartProcess stream ends: with its exit, or
 * with a message that declares more bytes than the bound and then sends
 * nothing (the client must not wait for them).
 */
let startEnds: "exit" | "huge" = "exit";

/** envelope frames a message of a Connect stream. */
function envelope(flags: number, payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(5 + payload.length);
  new DataView(out.buffer).setUint32(1, payload.length);
  out[0] = flags;
  out.set(payload, 5);
  return out;
}

/** Request and Answer are what HTTP/1.1's and HTTP/2's requests and responses share, as used here. */
type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Answer = {
  writeHead(status: number, headers: Record<string, string>): unknown;
  write(chunk: Uint8Array): unknown;
  end(chunk: Uint8Array): unknown;
};

/**
 * startProcess answers a StartProcess stream by hand, as a replaced guest
 * agent may: the started event, a message of small, then the end startEnds
 * says.
 */
function startProcess(req: Request, res: Answer): void {
  const type = req.headers["content-type"] ?? "";
  const encode = (e: ProcessEvent["event"]) => {
    const msg = create(ProcessEventSchema, { event: e });
    return type.endsWith("+json") ? new TextEncoder().encode(toJsonString(ProcessEventSchema, msg)) : toBinary(ProcessEventSchema, msg);
  };
  req.resume();
  res.writeHead(200, { "content-type": type });
  res.write(envelope(0, encode({ case: "started", value: create(ProcessEvent_StartedSchema, { pid: 7 }) })));
  res.write(envelope(0, encode({ case: "stdout", value: small })));
  if (startEnds === "huge") {
    const prefix = new Uint8Array(5);
    new DataView(prefix.buffer).setUint32(1, maxDataPlaneMessage + 1);
    res.write(prefix); // and nothing more, until the client goes
    return;
  }
  res.write(envelope(0, encode({ case: "exited", value: create(ProcessEvent_ExitedSchema, { exitCode: 0 }) })));
  res.end(envelope(2, new TextEncoder().encode("{}")));
}

/** handler serves a deployment whose data plane is at url(). */
function handler(url: () => string) {
  const adapter = connectNodeAdapter({
    routes: (router: ConnectRouter) => {
      router.service(WorkspaceService, {
        getWorkspace: (req) => ({ workspace: { workspaceId: req.workspaceId, state: WorkspaceState.AVAILABLE } }),
      });
      router.service(SessionService, {
        issueSession: () => ({ sessionId: "ses_1", token: "sess-1", endpoint: url() }),
      });
      router.service(ProcessService, {
        listProcesses: () => ({ processes: [{ pid: 42, args: [huge] }] }),
        signalProcess: () => ({}),
      });
    },
  });
  return (req: Request, res: http.ServerResponse | http2.Http2ServerResponse) => {
    if (req.url === "/kibotos.data.v1.ProcessService/StartProcess") return startProcess(req, res as Answer);
    if (req.url?.startsWith("/kibotos.data.v1.files?")) return endlessError(res as Answer);
    adapter(req as never, res as never);
  };
}

/** endlessError answers a GET of a file's bytes with an error whose body does not end. */
function endlessError(res: Answer): void {
  res.writeHead(500, { "content-type": "application/json" });
  res.write(new TextEncoder().encode(`{"code":"internal","message":"${"a".repeat(1 << 20)}`)); // and nothing more
}

/** serve starts server on loopback and returns its URL. */
async function serve(server: http.Server | http2.Http2Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

let h2: http2.Http2Server;
let h1: http.Server;
let h2URL = "";
const h2Sessions = new Set<http2.ServerHttp2Session>();
let h1URL = "";

before(async () => {
  h2 = http2.createServer(handler(() => h2URL));
  h2.on("session", (s) => h2Sessions.add(s));
  h1 = http.createServer(handler(() => h1URL));
  h2URL = await serve(h2);
  h1URL = await serve(h1); // fetch speaks HTTP/1.1
});

after(async () => {
  // A test that timed out left its client's connections open: close them.
  h1.closeAllConnections();
  for (const s of h2Sessions) s.destroy();
  await Promise.all([h2, h1].map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
});

function resourceExhausted(err: unknown): boolean {
  assert.ok(err instanceof KibotosError, `${err}`);
  assert.equal(err.code, Code.ResourceExhausted, err.message);
  assert.equal(err.reasonName, "RESOURCE_EXHAUSTED", "a refusal without an ErrorDetail has the reason its code implies");
  return true;
}

for (const [name, connect] of [
  ["@kibotos/sdk", () => Kibotos.connect({ url: h2URL, token: "api-token" })],
  ["@kibotos/sdk/web", () => WebKibotos.connect({ url: h1URL, token: "api-token" })],
] as const) {
  describe(name, () => {
    test("a unary answer over the bound is refused", { timeout: 20_000 }, async () => {
      const kb = connect();
      try {
        const ws = await kb.getWorkspace("ws_1");
        await assert.rejects(ws.processes(), resourceExhausted);
      } finally {
        kb.close();
      }
    });

    test("an error answer of the file bytes path is read up to its bound", { timeout: 20_000 }, async () => {
      if (name !== "@kibotos/sdk/web") return; // the fake's HTTP/2 listener has no HTTP/1.1 for fetch
      const kb = connect();
      try {
        const ws = await kb.getWorkspace("ws_1");
        await assert.rejects(ws.files.read("/endless"), (err: unknown) => {
          assert.ok(err instanceof KibotosError, `${err}`);
          assert.ok(/HTTP 500: \{"code":"internal","message":"a+$/.test(err.message), err.message.slice(0, 100));
          assert.ok(err.message.length <= maxErrorBody + 20, `a message of ${err.message.length} bytes`);
          return true;
        });
      } finally {
        kb.close();
      }
    });

    test("a stream's message over the bound is refused; those within it pass", { timeout: 20_000 }, async () => {
      const kb = connect();
      try {
        const ws = await kb.getWorkspace("ws_1");
        let read = 0;
        startEnds = "exit";
        const ok = await ws.exec(["true"], { onStdout: (b) => (read += b.length) });
        assert.equal(ok.exitCode, 0);
        assert.equal(read, small.length);
        startEnds = "huge";
        await assert.rejects(ws.exec(["true"]), resourceExhausted);
      } finally {
        kb.close();
      }
    });
  });
}
