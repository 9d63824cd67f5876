// Session renewal against an in-process fake of the control and data
// plane, which can report any session expired: the only way to see the
// SDK replace a session the data plane refuses before its expiry. Its
// HTTP/1.1 (fetch's) answers 404 to everything, as a data plane without the
// file bytes path, so downloads go through ReadFile.
import assert from "node:assert/strict";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  ErrorDetailSchema,
  FailureReason,
  FailureStage,
  SessionService,
  WorkspaceService,
  WorkspaceState,
} from "../gen/kibotos/ctrl/v1/ctrl_pb.js";
import { FileService, FileType } from "../gen/kibotos/data/v1/data_pb.js";
import { Kibotos, KibotosError } from "../src/index.js";

/** fake is the state of the fake deployment. */
const fake = {
  issued: [] as string[], // session tokens, in order
  expired: new Set<string>(), // tokens the data plane refuses as expired
  stale: new Set<string>(), // tokens of an earlier start of the workspace
  used: [] as string[], // the token of each data-plane call, in order
};

function authorize(ctx: HandlerContext): void {
  const token = (ctx.requestHeader.get("Authorization") ?? "").replace(/^Bearer /, "");
  fake.used.push(token);
  if (fake.expired.has(token)) {
    throw new ConnectError("session expired", Code.Unauthenticated, undefined, [
      { desc: ErrorDetailSchema, value: { reason: FailureReason.SESSION_EXPIRED } },
    ]);
  }
  if (fake.stale.has(token)) {
    throw new ConnectError("invalid session token: not valid for a running execution of its workspace", Code.Unauthenticated, undefined, [
      { desc: ErrorDetailSchema, value: { reason: FailureReason.UNAUTHENTICATED, stage: FailureStage.AUTHORIZING_DATA_PLANE } },
    ]);
  }
}

let server: net.Server;
let backends: net.Server[];
let url: string;

before(async () => {
  const routes = (router: ConnectRouter) => {
    router.service(WorkspaceService, {
      getWorkspace: (req) => ({ workspace: { workspaceId: req.workspaceId, state: WorkspaceState.AVAILABLE } }),
    });
    router.service(SessionService, {
      issueSession: (_req, ctx) => {
        if (ctx.requestHeader.get("Authorization") !== "Bearer api-token") {
          throw new ConnectError("want the API token", Code.Unauthenticated);
        }
        const token = `sess-${fake.issued.length + 1}`;
        fake.issued.push(token);
        return { sessionId: `ses_${token}`, token, endpoint: url, expiresAt: timestampFromDate(new Date(Date.now() + 3600_000)) };
      },
    });
    router.service(FileService, {
      inspectFile: (req, ctx) => {
        authorize(ctx);
        return { file: { path: req.path, type: FileType.FILE, size: 1n } };
      },
      async *readFile(req, ctx) {
        authorize(ctx);
        yield { data: new TextEncoder().encode(`bytes of ${req.path}`) };
      },
    });
  };
  const h2 = http2.createServer(connectNodeAdapter({ routes }));
  const h1 = http.createServer((_req, res) => res.writeHead(404, { "Content-Type": "text/plain" }).end("404 page not found\n"));
  const [h2Port, h1Port] = [await listen(h2), await listen(h1)];
  backends = [h2, h1];
  // One port for both, each connection passed to the one its first bytes
  // name (HTTP/2's connection preface, or not).
  server = net.createServer((conn) => {
    conn.once("data", (head) => {
      const to = net.connect(head.toString("latin1").startsWith("PRI * HTTP/2.0") ? h2Port : h1Port, "127.0.0.1");
      to.write(head);
      conn.pipe(to).pipe(conn);
      const end = () => (conn.destroy(), to.destroy());
      conn.on("error", end).on("close", end);
      to.on("error", end).on("close", end);
    });
  });
  await listen(server);
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  for (const s of [server, ...backends]) {
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }
});

/** listen starts s on a free loopback port and returns the port. */
async function listen(s: net.Server): Promise<number> {
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  return (s.address() as AddressInfo).port;
}

test("a session the data plane reports expired is replaced once, transparently", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const ws = await kb.getWorkspace("ws_1");
    await ws.files.stat("/a");
    fake.expired.add("sess-1");
    await ws.files.stat("/a"); // refused with sess-1, then sent with sess-2
    assert.equal(await ws.files.readText("/b"), "bytes of /b"); // a stream, on sess-2
    fake.expired.add("sess-2");
    assert.equal(await ws.files.readText("/b"), "bytes of /b"); // refused with sess-2, then sess-3
    assert.deepEqual(fake.issued, ["sess-1", "sess-2", "sess-3"]);
    assert.deepEqual(fake.used, ["sess-1", "sess-1", "sess-2", "sess-2", "sess-2", "sess-3"]);

    // A new session that is refused too is the caller's error: one retry only.
    fake.expired.add("sess-3");
    fake.expired.add("sess-4");
    await assert.rejects(ws.files.stat("/a"), (err: unknown) => {
      assert.ok(err instanceof KibotosError);
      assert.equal(err.code, Code.Unauthenticated);
      assert.equal(err.reason, FailureReason.SESSION_EXPIRED);
      return true;
    });
    assert.deepEqual(fake.issued, ["sess-1", "sess-2", "sess-3", "sess-4"]);
  } finally {
    kb.close();
  }
});

test("the control plane's token goes to the control plane, the session's to the data plane", async () => {
  fake.used.length = 0;
  fake.expired.clear();
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const ws = await kb.getWorkspace("ws_2");
    const s = await ws.session();
    await ws.files.stat("/a");
    assert.deepEqual(fake.used, [s.token]);
    assert.notEqual(s.token, "api-token");
    assert.ok(s.expiresAt instanceof Date);
  } finally {
    kb.close();
  }
});

test("a session of an earlier start of the workspace is replaced: the handle outlives a restart", async () => {
  fake.used.length = 0;
  fake.issued.length = 0;
  fake.expired.clear();
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const ws = await kb.getWorkspace("ws_3");
    await ws.files.stat("/a");
    fake.stale.add("sess-1"); // the workspace stopped and started again
    await ws.files.stat("/a");
    assert.deepEqual(fake.issued, ["sess-1", "sess-2"]);
    assert.deepEqual(fake.used, ["sess-1", "sess-1", "sess-2"]);
  } finally {
    kb.close();
  }
});
