// End-to-end tests of the SDK against a real deployment: one workspace,
// created by the first test, serves the others, and is deleted at the end.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { PassThrough, Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import {
  Code,
  FailureReason,
  FailureStage,
  FileEventType,
  FileType,
  Kibotos,
  KibotosError,
  type Workspace,
  WorkspaceState,
} from "../src/index.js";
import { connect, deployment, MIB } from "./env.js";

const text = (b: Uint8Array) => new TextDecoder().decode(b);

/** isKibotosError returns a predicate for assert.rejects matching code, reason and stage. */
function isKibotosError(code: Code, reason?: FailureReason, stage?: FailureStage) {
  return (err: unknown) => {
    assert.ok(err instanceof KibotosError, `want a KibotosError, got ${String(err)}`);
    assert.equal(err.codeName, new KibotosError("", code).codeName, err.message);
    if (reason !== undefined) assert.equal(err.reasonName, FailureReason[reason], err.message);
    if (stage !== undefined) assert.equal(err.stageName, FailureStage[stage], err.message);
    return true;
  };
}

/** sha256 returns the hex SHA-256 of a local file. */
async function sha256(path: string): Promise<string> {
  const h = createHash("sha256");
  await pipeline(createReadStream(path), h);
  return h.digest("hex");
}

describe("a workspace", () => {
  const kb = connect();
  let ws: Workspace;
  after(async () => {
    await ws?.delete();
    kb.close();
  });

  test("createWorkspace resolves once the workspace is AVAILABLE", async () => {
    ws = await kb.createWorkspace({ memoryBytes: 256 * MIB, diskBytes: 512 * MIB, labels: { suite: "typescript" } });
    assert.equal(ws.info.state, WorkspaceState.AVAILABLE);
    const again = await kb.getWorkspace(ws.id);
    assert.equal(again.info.state, WorkspaceState.AVAILABLE);
    assert.equal(again.info.labels.suite, "typescript");
  });

  test("exec streams stdout and stderr and resolves to the exit code", async () => {
    let out = "";
    let errOut = "";
    const r = await ws.exec(["sh", "-c", "echo one; echo two >&2; echo three; exit 7"], {
      onStdout: (b) => (out += text(b)),
      onStderr: (b) => (errOut += text(b)),
    });
    assert.equal(r.exitCode, 7);
    assert.equal(r.signal, "");
    assert.equal(out, "one\nthree\n");
    assert.equal(errOut, "two\n");
  });

  test("output arrives while the process runs", async () => {
    let out = "";
    let seen!: () => void;
    const ready = new Promise<void>((resolve) => (seen = resolve));
    const p = await ws.start(["sh", "-c", "echo ready; read line; echo got $line"], {
      stdin: true,
      onStdout: (b) => {
        out += text(b);
        if (out.includes("ready")) seen();
      },
    });
    assert.ok(p.pid > 0);
    await ready; // the process is blocked reading its input: its first line came while it ran
    await p.sendInput("hi\n");
    await p.closeInput();
    const r = await p.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(out, "ready\ngot hi\n");
  });

  test("streamed stdin reaches the process as each piece comes, not once 32 KiB gathered", async () => {
    let out = "";
    let answered!: () => void;
    const answer = new Promise<void>((resolve) => (answered = resolve));
    let sourceEnded = false;
    let inTime = false;
    async function* input() {
      yield new TextEncoder().encode("hi\n");
      // The source ends once the process answered its line, or after 5 s.
      await Promise.race([answer, sleep(5000)]);
      sourceEnded = true;
    }
    const r = await ws.exec(["sh", "-c", "read line; echo got $line"], {
      stdin: input(),
      onStdout: (b) => {
        out += text(b);
        if (out.includes("got hi")) {
          // Judged when the answer comes: exec may end before the source.
          inTime ||= !sourceEnded;
          answered();
        }
      },
    });
    assert.deepEqual([r.exitCode, out], [0, "got hi\n"]);
    assert.ok(inTime, "the process got its line only when the source ended");
  });

  test("exec collects the output when no callback takes it, with env and cwd", async () => {
    const r = await ws.exec(["sh", "-c", "echo $GREETING; pwd; echo oops >&2"], { env: { GREETING: "hi" }, cwd: "/tmp" });
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, "hi\n/tmp\n", "oops\n"]);
  });

  test("stdin is sent to the process and closed at its end", async () => {
    const small = await ws.exec(["cat"], { stdin: "hello\nworld\n" });
    assert.equal(small.stdout, "hello\nworld\n");
    // 1 MiB from a stream, in many SendInput calls.
    const big = randomBytes(MIB);
    const r = await ws.exec(["sh", "-c", "wc -c; echo done >&2"], { stdin: Readable.from([big.subarray(0, 1000), big.subarray(1000)]) });
    assert.equal(r.stdout.trim(), String(MIB));
    assert.equal(r.stderr, "done\n");
  });

  test("a PTY runs the process on a terminal of the size asked for", async () => {
    const r = await ws.exec(["sh", "-c", "tty; stty size"], { pty: { cols: 100, rows: 30 } });
    assert.equal(r.exitCode, 0);
    assert.match(r.stdout, /^\/dev\/pts\/\d+\r\n30 100\r\n$/);
    assert.equal(r.stderr, "");
  });

  test("a background process is killed and its wait says by which signal", async () => {
    const p = await ws.start(["sleep", "600"]);
    const listed = await ws.processes();
    assert.ok(listed.some((i) => i.pid === p.pid && i.exited === undefined), "the process runs");
    await p.kill();
    const r = await p.wait();
    assert.equal(r.signal, "SIGKILL");
  });

  test("timeoutMs kills a process that runs too long", async () => {
    await assert.rejects(ws.exec(["sleep", "600"], { tag: "too-long", timeoutMs: 200 }), isKibotosError(Code.DeadlineExceeded));
    const listed = await ws.processes();
    const info = listed.find((i) => i.tag === "too-long");
    assert.equal(info?.exited?.signal, "SIGKILL");
  });

  test("a 64 MiB file goes up and comes back unchanged", async () => {
    const dir = await mkdtemp(join(tmpdir(), "kibotos-sdk-"));
    try {
      const src = join(dir, "up");
      const back = join(dir, "back");
      const size = 64 * MIB;
      await writeFile(src, randomBytes(size));
      let progress = 0;
      const info = await ws.files.upload("/root/big", createReadStream(src), { mode: 0o600, onProgress: (n) => (progress = n) });
      assert.equal(info.size, BigInt(size));
      assert.equal(info.mode, 0o600);
      assert.equal(progress, size);
      const want = await sha256(src);
      const inGuest = await ws.exec(["sha256sum", "/root/big"]);
      assert.equal(inGuest.stdout.split(" ")[0], want);
      let seen: bigint | undefined;
      await pipeline(Readable.from(ws.files.download("/root/big", { onInfo: (i) => (seen = i.size) })), createWriteStream(back));
      assert.equal(seen, BigInt(size));
      assert.equal(await sha256(back), want);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test("an upload whose source fails, or that is aborted, writes nothing", async () => {
    await ws.files.write("/root/kept", "old");
    async function* failing() {
      yield randomBytes(2 * MIB);
      throw new Error("the disk went away");
    }
    await assert.rejects(ws.files.upload("/root/kept", failing()), /the disk went away/);
    await assert.rejects(ws.files.upload("/root/fresh", failing()), /the disk went away/);
    // An abort while the source has nothing to give.
    const stop = new AbortController();
    async function* stalled() {
      yield randomBytes(MIB);
      await new Promise(() => undefined);
    }
    await assert.rejects(
      ws.files.upload("/root/kept", stalled(), { signal: stop.signal, onProgress: () => stop.abort() }),
      isKibotosError(Code.Canceled),
    );
    assert.equal(await ws.files.readText("/root/kept"), "old");
    await assert.rejects(ws.files.stat("/root/fresh"), isKibotosError(Code.NotFound));
  });

  test("a stream that fails before the SDK reads it rejects the call, and the caller's process lives on", async () => {
    // Both fail before the call reads them: the file does not exist; the
    // Readable errs on the next tick. A stream's 'error' that nobody
    // listens for would throw out of this process.
    const missing = () => createReadStream(join(tmpdir(), "kibotos-sdk-no-such-file"));
    const erring = () => {
      const r = new Readable({ read() {} });
      process.nextTick(() => r.destroy(new Error("the source broke at once")));
      return r;
    };
    const isReadError = (what: string, why: RegExp) => (err: unknown) => {
      assert.ok(err instanceof KibotosError, `want a KibotosError, got ${String(err)}`);
      assert.match(err.message, new RegExp(`^reading ${what}: ${why.source}`));
      return true;
    };
    for (const [source, why] of [
      [missing, /ENOENT/],
      [erring, /the source broke at once/],
    ] as const) {
      // A fresh handle: the upload issues its session and asks for the file
      // bytes path before it reads the source.
      const fresh = await kb.getWorkspace(ws.id);
      await assert.rejects(fresh.files.upload("/root/never", source()), isReadError("the upload", why));
      await assert.rejects(ws.files.upload("/root/never", source()), isReadError("the upload", why));
      // stdin is read once the process started; its input is then closed, so cat ends.
      await assert.rejects(ws.exec(["cat"], { stdin: source() }), isReadError("stdin", why));
    }
    await assert.rejects(ws.files.stat("/root/never"), isKibotosError(Code.NotFound));
  });

  test("a stream given to one call after another is left to the next as it was: no listener, nothing taken", async () => {
    const events = ["error", "readable", "data", "end", "close", "finish"];
    const listeners = (s: PassThrough) => Object.fromEntries(events.map((e) => [e, s.listenerCount(e)]));
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    try {
      const input = new PassThrough();
      const before = listeners(input);
      // true exits without reading its input; nothing is written before
      // its exec resolved, so no read of it can have taken anything.
      for (let i = 0; i < 12; i++) {
        const r = await ws.exec(["true"], { stdin: input });
        assert.equal(r.exitCode, 0);
        assert.deepEqual(listeners(input), before, `after exec ${i + 1}`);
      }
      assert.equal(input.destroyed, false);
      input.write("line1\n");
      input.end("line2\n");
      const r = await ws.exec(["cat"], { stdin: input });
      assert.equal(r.stdout, "line1\nline2\n");
      assert.deepEqual(listeners(input), before, "after cat read it to its end");

      // An upload, read to its end, or abandoned while its source has nothing to give.
      const up = new PassThrough();
      up.end("uploaded");
      await ws.files.upload("/root/uploaded", up);
      assert.deepEqual(listeners(up), before, "after an upload");
      assert.equal(await ws.files.readText("/root/uploaded"), "uploaded");
      const stalled = new PassThrough();
      const stop = new AbortController();
      setTimeout(() => stop.abort(), 200);
      await assert.rejects(ws.files.upload("/root/abandoned", stalled, { signal: stop.signal }), isKibotosError(Code.Canceled));
      assert.deepEqual(listeners(stalled), before, "after an abandoned upload");
      stalled.end("still here");
      assert.equal(Buffer.concat(await stalled.toArray()).toString(), "still here");

      await sleep(10); // a warning is emitted on a later tick
      assert.deepEqual(warnings, []);
    } finally {
      process.off("warning", onWarning);
    }
  });

  test("files: mkdir, write, list, stat, rename (merging too), read, remove", async () => {
    const dir = await ws.files.mkdir("/root/a/b", { parents: true });
    assert.equal(dir.type, FileType.DIRECTORY);
    await ws.files.write("/root/a/b/one.txt", "one");
    await ws.files.write("/root/a/two.txt", new Uint8Array([1, 2, 3]), { mode: 0o640 });
    const names = (await ws.files.list("/root/a", { depth: 2 })).map((e) => e.path);
    assert.deepEqual(names, ["/root/a/b", "/root/a/b/one.txt", "/root/a/two.txt"]);
    const st = await ws.files.stat("/root/a/two.txt");
    assert.deepEqual([st.type, st.size, st.mode], [FileType.FILE, 3n, 0o640]);
    await ws.files.rename("/root/a/b/one.txt", "/root/a/three.txt");
    assert.equal(await ws.files.readText("/root/a/three.txt"), "one");
    assert.deepEqual(await ws.files.read("/root/a/two.txt"), new Uint8Array([1, 2, 3]));
    await ws.files.mkdir("/root/m/b", { parents: true });
    await ws.files.write("/root/m/b/four.txt", "four");
    await ws.files.write("/root/m/two.txt", "two, new");
    await assert.rejects(ws.files.rename("/root/m", "/root/a"), isKibotosError(Code.AlreadyExists));
    await ws.files.rename("/root/m", "/root/a", { merge: true });
    assert.deepEqual(
      (await ws.files.list("/root/a", { depth: 2 })).map((e) => e.path),
      ["/root/a/b", "/root/a/b/four.txt", "/root/a/three.txt", "/root/a/two.txt"],
    );
    assert.equal(await ws.files.readText("/root/a/two.txt"), "two, new");
    await assert.rejects(ws.files.stat("/root/m"), isKibotosError(Code.NotFound));
    await assert.rejects(ws.files.remove("/root/a"), isKibotosError(Code.FailedPrecondition)); // not empty
    await ws.files.remove("/root/a", { recursive: true });
    await assert.rejects(ws.files.stat("/root/a"), isKibotosError(Code.NotFound, undefined, FailureStage.INSPECTING_FILE));
  });

  test("a file bytes request that got no answer is unavailable and decides nothing of the path", async () => {
    const h = await kb.getWorkspace(ws.id); // a new session: whether its endpoint serves the path is not known yet
    const realFetch = globalThis.fetch;
    let bytesRequests = 0;
    globalThis.fetch = (input, init) => {
      if (String(input).includes("/kibotos.data.v1.files?") && bytesRequests++ === 0) {
        return Promise.reject(new TypeError("fetch failed", { cause: new Error("read ECONNRESET") })); // as a cut connection
      }
      return realFetch(input, init);
    };
    try {
      await assert.rejects(h.files.write("/tmp/weather", "one"), isKibotosError(Code.Unavailable));
      await h.files.write("/tmp/weather", "two");
      assert.equal(await h.files.readText("/tmp/weather"), "two");
      assert.ok(bytesRequests > 1, "after one failed request the handle no longer used the file bytes path");
    } finally {
      globalThis.fetch = realFetch;
    }
  });

  test("a streamed upload refused for its session is sent again with a new one, its source read once", async () => {
    const h = await kb.getWorkspace(ws.id);
    await h.files.write("/tmp/refused", "before");
    await kb.stopWorkspace(ws.id);
    await kb.startWorkspace(ws.id); // h's session was of the earlier start
    const data = randomBytes(2 * MIB + 12345);
    let reads = 0;
    async function* streamed() {
      reads++;
      for (let at = 0; at < data.length; at += 300 * 1024) yield data.subarray(at, at + 300 * 1024);
    }
    const progress: number[] = [];
    const info = await h.files.upload("/tmp/refused", streamed(), { onProgress: (n) => progress.push(n) });
    assert.equal(info.size, BigInt(data.length));
    assert.equal(reads, 1);
    assert.ok(
      progress.every((n, i) => i === 0 || n > progress[i - 1]) && progress.at(-1) === data.length,
      `progress ${progress} does not rise to ${data.length}`,
    );
    const got = createHash("sha256").update(await h.files.read("/tmp/refused")).digest("hex");
    assert.equal(got, createHash("sha256").update(data).digest("hex"));
  });

  test("a download of a file that shrinks under it is aborted, saying so", async () => {
    await ws.exec(["truncate", "-s", "2G", "/tmp/shrinks"]);
    const read = async () => {
      let shrunk = false;
      for await (const _ of ws.files.download("/tmp/shrinks")) {
        if (!shrunk) {
          shrunk = true;
          await ws.exec(["truncate", "-s", "1M", "/tmp/shrinks"]);
        }
      }
    };
    await assert.rejects(read(), (e: unknown) => {
      assert.ok(e instanceof KibotosError && e.code === Code.Aborted, String(e));
      assert.match(e.message, /\/tmp\/shrinks changed while it was read \(2147483648 bytes when the read began, 1048576 now\)/);
      return true;
    });
  });

  test("watch yields the changes under a directory as an async iterator", async () => {
    await ws.files.mkdir("/root/watched");
    const stop = new AbortController();
    const events = ws.files.watch("/root/watched", { signal: stop.signal });
    const first = events.next(); // opens the watch
    // The watch is in place at some point after the call: write until it reports.
    let got: IteratorResult<{ path: string; type: FileEventType }> | undefined;
    for (let i = 0; got === undefined; i++) {
      await ws.files.write(`/root/watched/f${i}`, "x");
      got = await Promise.race([first, sleep(200).then(() => undefined)]);
    }
    // A write goes to a temporary file renamed into place: its events come
    // first, then the file's own.
    while (!got.done && !/^\/root\/watched\/f\d+$/.test(got.value.path)) {
      assert.match(got.value.path, /^\/root\/watched\//);
      got = await events.next();
    }
    assert.equal(got.done, false);
    assert.ok(
      [FileEventType.CREATE, FileEventType.RENAME, FileEventType.WRITE].includes(got.value.type),
      FileEventType[got.value.type],
    );
    stop.abort();
    assert.equal((await events.next()).done, true);
  });

  test("a data-plane error carries its code and stage", async () => {
    await assert.rejects(ws.files.read("/root/missing"), isKibotosError(Code.NotFound, undefined, FailureStage.READING_FILE));
    await assert.rejects(ws.exec([]), isKibotosError(Code.InvalidArgument, undefined, FailureStage.STARTING_PROCESS));
    await assert.rejects(
      ws.files.watch("/root/missing").next(),
      isKibotosError(Code.NotFound, undefined, FailureStage.WATCHING_DIRECTORY),
    );
  });

  test("a revoked session is unauthenticated with reason SESSION_REVOKED", async () => {
    const h = await kb.getWorkspace(ws.id);
    const s = await h.session();
    await kb.sessions.revokeSession({ command: { commandId: `revoke-${s.id}` }, sessionId: s.id });
    // Revocation takes effect within a second.
    await assert.rejects(async () => {
      for (;;) {
        await h.files.stat("/root");
        await sleep(100);
      }
    }, isKibotosError(Code.Unauthenticated, FailureReason.SESSION_REVOKED, FailureStage.AUTHORIZING_DATA_PLANE));
  });

  test("sessions are renewed before they expire, a short one in the second half of its life", async () => {
    // A session of 2 seconds serves calls for its first second, then the
    // next call issues a new one.
    const short = Kibotos.connect({ ...deployment(), sessionTtlSeconds: 2 });
    try {
      const h = await short.getWorkspace(ws.id);
      const first = await h.session();
      assert.equal((await h.exec(["true"])).exitCode, 0);
      assert.equal((await h.session()).id, first.id, "a session within the first half of its life was replaced");
      await sleep(1100);
      assert.equal((await h.exec(["true"])).exitCode, 0);
      const second = await h.session();
      assert.notEqual(second.id, first.id);
      assert.notEqual(second.token, first.token);
    } finally {
      short.close();
    }
  });

  test("exec kills a process it can no longer follow", async () => {
    const loop = ["sh", "-c", "echo $$ > /tmp/ticker; while true; do echo tick; sleep 0.1; done"];
    const sinkClosed = () => {
      throw new Error("sink closed");
    };
    await assert.rejects(ws.exec(loop, { onStdout: sinkClosed }), (err: unknown) => String(err).includes("sink closed"));
    for (let i = 0; ; i++) {
      const r = await ws.exec(["sh", "-c", "kill -0 $(cat /tmp/ticker) 2>/dev/null && echo running || echo gone"]);
      if (r.stdout === "gone\n") break;
      assert.ok(i < 100, "the process of the failed exec still runs");
      await sleep(50);
    }
  });

  test("exec and start with a signal already aborted are canceled and start nothing", async () => {
    const aborted = AbortSignal.abort();
    await assert.rejects(ws.start(["touch", "/tmp/aborted-start"], { signal: aborted }), isKibotosError(Code.Canceled));
    await assert.rejects(ws.exec(["touch", "/tmp/aborted-exec"], { signal: aborted }), isKibotosError(Code.Canceled));
    for (const path of ["/tmp/aborted-start", "/tmp/aborted-exec"]) {
      await assert.rejects(ws.files.stat(path), isKibotosError(Code.NotFound), `${path} exists: its process ran`);
    }
  });

  test("a process handle acts only in its own start of the workspace", async () => {
    // Each start's first process gets the same pid: the old handle's pid
    // names the new process, which its calls must not reach.
    const restart = async () => {
      await kb.stopWorkspace(ws.id);
      await kb.startWorkspace(ws.id);
    };
    await restart();
    const old = await ws.start(["sleep", "600"]);
    await restart();
    await old.wait().catch(() => undefined);
    const fresh = await ws.start(["sleep", "600"]);
    try {
      await assert.rejects(old.kill(), isKibotosError(Code.NotFound));
      const listed = await ws.processes();
      assert.ok(listed.some((i) => i.pid === fresh.pid && i.exited === undefined), "the new start's process runs");
    } finally {
      await fresh.kill();
    }
  });
});

describe("control-plane errors", () => {
  const kb = connect();
  after(() => kb.close());

  test("an unknown workspace is not_found", async () => {
    await assert.rejects(kb.getWorkspace("ws_doesnotexist"), isKibotosError(Code.NotFound));
  });

  test("a bad request is invalid_argument and creates nothing", async () => {
    await assert.rejects(
      kb.createWorkspace({ memoryBytes: 100 * MIB + 1, labels: { suite: "typescript-invalid" } }),
      isKibotosError(Code.InvalidArgument),
    );
    assert.deepEqual(await kb.listWorkspaces({ labelSelector: { suite: "typescript-invalid" } }), []);
  });

  test("a capability the template lacks is failed_precondition with reason CAPABILITY_UNAVAILABLE", async () => {
    await assert.rejects(
      kb.createWorkspace({ capabilities: ["screen"], labels: { suite: "typescript-invalid" } }),
      isKibotosError(Code.FailedPrecondition, FailureReason.CAPABILITY_UNAVAILABLE, FailureStage.VALIDATING),
    );
    assert.deepEqual(await kb.listWorkspaces({ labelSelector: { suite: "typescript-invalid" } }), []);
  });

  test("a bad template reference is refused before any call", async () => {
    await assert.rejects(kb.createWorkspace({ template: "base@" }), isKibotosError(Code.InvalidArgument));
  });
});
