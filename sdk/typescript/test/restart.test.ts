// A deployment that restarts, on an in-process fake of the control and
// data plane behind a proxy the test controls: it cuts every connection
// in the middle of its calls (the server's process died), and refuses new
// ones for a while (it is not back yet). The real deployment of the other
// tests cannot be restarted under them.
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import * as net from "node:net";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { SessionService, WorkspaceService, WorkspaceState } from "../gen/kibotos/ctrl/v1/ctrl_pb.js";
import { ProcessService } from "../gen/kibotos/data/v1/data_pb.js";
import { Code, Kibotos, KibotosError } from "../src/index.js";

/** deployment is the fake's state and the proxy's controls. */
const deployment = {
  watches: 0, // WatchWorkspace calls
  cutNextWatch: false, // cut the connections once the next watch has begun
  hangNextWatch: false, // the next watch says STARTING and then nothing
  started: 0, // StartProcess calls
  kills: [] as number[], // the pid of each SignalProcess
  refuseKills: 0, // SignalProcess calls to refuse unavailable, saying refusal
  refusal: "",
  states: new Map<string, WorkspaceState>(), // GetWorkspace's state of a workspace, AVAILABLE when absent
};

let backend: http2.Http2Server;
let proxy: net.Server;
let port: number;
let url: string;
const connections = new Set<net.Socket>();

/** cut breaks every connection through the proxy, as a server whose process died. */
function cut(): void {
  for (const c of connections) c.destroy();
  connections.clear();
}

/** down stops the deployment: its connections are cut and new ones refused until up. */
async function down(): Promise<void> {
  await new Promise<void>((resolve) => {
    proxy.close(() => resolve());
    cut();
  });
}

/** up lets the deployment be reached again, on its port. */
function up(): Promise<void> {
  return new Promise<void>((resolve) => proxy.listen(port, "127.0.0.1", resolve));
}

/** execThroughRestart runs exec on a fake process of workspace id and stops the deployment once it started. */
async function execThroughRestart(kb: Kibotos, id = "ws_4"): Promise<{ exec: Promise<unknown> }> {
  const ws = await kb.getWorkspace(id);
  deployment.kills.length = 0;
  const startedBefore = deployment.started;
  const exec = ws.exec(["sleep", "600"]);
  exec.catch(() => undefined);
  while (deployment.started === startedBefore) await sleep(10);
  await sleep(100); // the started event reaches the client
  await down();
  return { exec };
}

before(async () => {
  const routes = (router: ConnectRouter) => {
    router.service(WorkspaceService, {
      getWorkspace: (req) => ({
        workspace: { workspaceId: req.workspaceId, state: deployment.states.get(req.workspaceId) ?? WorkspaceState.AVAILABLE },
      }),
      startWorkspace: (req) => ({ workspace: { workspaceId: req.workspaceId, state: WorkspaceState.STARTING } }),
      async *watchWorkspace(req, ctx) {
        deployment.watches++;
        if (deployment.hangNextWatch) {
          deployment.hangNextWatch = false;
          yield { workspace: { workspaceId: req.workspaceId, state: WorkspaceState.STARTING } };
          await sleep(600_000, undefined, { signal: ctx.signal }).catch(() => undefined);
          return;
        }
        if (deployment.cutNextWatch) {
          deployment.cutNextWatch = false;
          yield { workspace: { workspaceId: req.workspaceId, state: WorkspaceState.STARTING } };
          setTimeout(cut, 100); // once the message reached the client
          await sleep(10_000, undefined, { signal: ctx.signal }).catch(() => undefined); // the cut ends it
          return;
        }
        yield { workspace: { workspaceId: req.workspaceId, state: WorkspaceState.AVAILABLE } };
      },
    });
    router.service(ProcessService, {
      async *startProcess(_req, ctx) {
        deployment.started++;
        yield { event: { case: "started", value: { pid: 42, bootId: "boot-1" } } };
        await sleep(600_000, undefined, { signal: ctx.signal }).catch(() => undefined); // it runs until the stream ends
      },
      signalProcess: (req) => {
        if (deployment.refuseKills > 0) {
          deployment.refuseKills--;
          throw new ConnectError(deployment.refusal, Code.Unavailable);
        }
        if (req.process?.selector.case === "pid") deployment.kills.push(req.process.selector.value);
        return {};
      },
    });
    router.service(SessionService, {
      issueSession: () => ({
        sessionId: "ses_1",
        token: "sess-1",
        endpoint: url,
        expiresAt: timestampFromDate(new Date(Date.now() + 3600_000)),
      }),
    });
  };
  backend = http2.createServer(connectNodeAdapter({ routes }));
  await new Promise<void>((resolve) => backend.listen(0, "127.0.0.1", resolve));
  const backendPort = (backend.address() as AddressInfo).port;
  proxy = net.createServer((conn) => {
    const to = net.connect(backendPort, "127.0.0.1");
    connections.add(conn).add(to);
    conn.pipe(to).pipe(conn);
    const end = () => (conn.destroy(), to.destroy());
    conn.on("error", end).on("close", end);
    to.on("error", end).on("close", end);
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  port = (proxy.address() as AddressInfo).port;
  url = `http://127.0.0.1:${port}`;
});

after(async () => {
  cut();
  for (const s of [proxy, backend]) await new Promise<void>((resolve) => s.close(() => resolve()));
});

test("a lifecycle wait rides over a connection cut by a restart", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    deployment.cutNextWatch = true;
    const ws = await kb.startWorkspace("ws_1");
    assert.equal(ws.info.state, WorkspaceState.AVAILABLE);
    assert.equal(deployment.watches, 2, "the cut watch was opened again");
  } finally {
    kb.close();
  }
});

test("a call whose connection is cut is unavailable; one its caller aborted stays canceled", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  const code = (err: unknown) => ConnectError.from(err).code;
  try {
    deployment.cutNextWatch = true;
    const watch = kb.workspaces.watchWorkspace({ workspaceId: "ws_2" })[Symbol.asyncIterator]();
    await watch.next();
    await assert.rejects(watch.next(), (err: unknown) => code(err) === Code.Unavailable);

    const stop = new AbortController();
    const aborted = kb.workspaces.watchWorkspace({ workspaceId: "ws_3" }, { signal: stop.signal })[Symbol.asyncIterator]();
    stop.abort();
    await assert.rejects(aborted.next(), (err: unknown) => code(err) === Code.Canceled);
  } finally {
    kb.close();
  }
});

/** unavailableWithNothingRunning is an exec's rejection that does not say its process may still run. */
function unavailableWithNothingRunning(err: unknown): boolean {
  assert.ok(err instanceof KibotosError);
  assert.equal(err.code, Code.Unavailable, err.message);
  assert.doesNotMatch(err.message, /may still run/);
  return true;
}

test("exec whose stream a restart broke kills its process once the data plane is back", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const { exec } = await execThroughRestart(kb);
    const back = sleep(700).then(up);
    try {
      await assert.rejects(exec, unavailableWithNothingRunning);
    } finally {
      await back;
    }
    assert.deepEqual(deployment.kills, [42]);
  } finally {
    kb.close();
  }
});

test("exec whose process could not be killed for 10 s says it may still run", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const { exec } = await execThroughRestart(kb);
    try {
      await assert.rejects(exec, (err: unknown) => {
        assert.ok(err instanceof KibotosError);
        assert.equal(err.code, Code.Unavailable, err.message);
        assert.match(err.message, /pid 42 may still run: the data plane could not be reached to kill it: .*ECONNREFUSED/);
        return true;
      });
    } finally {
      await up();
    }
    assert.deepEqual(deployment.kills, []);
  } finally {
    kb.close();
  }
});

test("exec whose kill the restarted host refuses out of service kills its process once it serves", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const { exec } = await execThroughRestart(kb);
    // Back, but its host agent has not registered yet: the data plane
    // answers unavailable, as it does for a workspace that stopped.
    deployment.refuseKills = 3;
    deployment.refusal = "this host is out of service: it has not registered with the control plane since it started";
    await up();
    await assert.rejects(exec, unavailableWithNothingRunning);
    assert.equal(deployment.refuseKills, 0, "the refused kill was not sent again");
    assert.deepEqual(deployment.kills, [42]);
  } finally {
    deployment.refuseKills = 0;
    kb.close();
  }
});

test("exec whose workspace stopped under it does not say its process may still run", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  try {
    const { exec } = await execThroughRestart(kb, "ws_6");
    deployment.states.set("ws_6", WorkspaceState.STOPPED);
    deployment.refuseKills = Infinity;
    deployment.refusal = "workspace ws_6 is not running on this host; retry once it runs";
    await up();
    await assert.rejects(exec, unavailableWithNothingRunning);
    assert.deepEqual(deployment.kills, []);
  } finally {
    deployment.refuseKills = 0;
    kb.close();
  }
});

test("closing the client ends a lifecycle wait canceled, and nothing opens a connection again", async () => {
  const kb = Kibotos.connect({ url, token: "api-token" });
  deployment.hangNextWatch = true;
  const watchesBefore = deployment.watches;
  const waiting = kb.startWorkspace("ws_5");
  waiting.catch(() => undefined);
  while (deployment.watches === watchesBefore) await sleep(10);
  await sleep(100); // the STARTING reaches the client
  kb.close();
  await assert.rejects(waiting, (err: unknown) => err instanceof KibotosError && err.code === Code.Canceled);
  await sleep(300);
  assert.equal(deployment.watches, watchesBefore + 1, "a watch was opened again after close");
  await assert.rejects(kb.getWorkspace("ws_5"), (err: unknown) => err instanceof KibotosError && err.code === Code.Canceled);
});
