// The browser entry point: it bundles for a browser with nothing of
// Node.js, and its client (connect-web over fetch, here Node.js's fetch)
// works against the real deployment.
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, describe, test } from "node:test";
import { build } from "esbuild";
import { Code, Kibotos, KibotosError, type Workspace } from "@kibotos/sdk/web";
import { deployment, MIB } from "./env.js";

const dist = join(dirname(fileURLToPath(import.meta.url)), "..", "src");

/** bundle bundles entry for a browser, as a page's build would. */
function bundle(entry: string) {
  return build({
    entryPoints: [join(dist, entry)],
    bundle: true,
    platform: "browser",
    format: "esm",
    write: false,
    logLevel: "silent",
  });
}

describe("@kibotos/sdk/web", () => {
  test("bundles for a browser with no Node.js module", async () => {
    const out = await bundle("web.js");
    const code = out.outputFiles[0].text;
    assert.doesNotMatch(code, /\bfrom\s*["']node:|require\(["']/);
    // esbuild names each bundled module in a comment.
    assert.match(code, /@connectrpc\/connect-web\//);
    assert.doesNotMatch(code, /@connectrpc\/connect-node\//);
    // The Node.js entry does not bundle for a browser: the check bites.
    await assert.rejects(bundle("index.js"), /node:|http2/);
  });

  describe("against the deployment", () => {
    const kb = Kibotos.connect(deployment());
    let ws: Workspace | undefined;
    after(async () => {
      await ws?.delete();
      kb.close();
    });

    test("creates a workspace, execs with streamed output, reads a file", async () => {
      ws = await kb.createWorkspace({ memoryBytes: 256 * MIB, labels: { suite: "typescript-web" } });
      const chunks: string[] = [];
      const res = await ws.exec(["sh", "-c", "echo one; echo two >&2; printf web > /tmp/w; exit 3"], {
        onStdout: (b) => chunks.push(new TextDecoder().decode(b)),
      });
      assert.equal(res.exitCode, 3);
      assert.equal(chunks.join(""), "one\n");
      assert.equal(res.stderr, "two\n");
      assert.equal(await ws.files.readText("/tmp/w"), "web");
      const names = (await ws.files.list("/tmp")).map((f) => f.path);
      assert.ok(names.includes("/tmp/w"), `list /tmp: ${names}`);
    });

    test("writes and uploads go whole as the body of a PUT of the file bytes path", async () => {
      assert.ok(ws);
      const info = await ws.files.write("/tmp/x", "data", { mode: 0o600 });
      assert.equal(info.size, 4n);
      assert.equal(info.mode, 0o600);
      assert.equal(await ws.files.readText("/tmp/x"), "data");
      // A stream is gathered first: fetch cannot stream a request.
      let progress = 0;
      async function* parts() {
        yield new Uint8Array(MIB).fill(7);
        yield "tail";
      }
      await ws.files.upload("/tmp/y", parts(), { onProgress: (n) => (progress = n) });
      assert.equal(progress, MIB + 4);
      assert.equal((await ws.files.stat("/tmp/y")).size, BigInt(MIB + 4));
      // A source that fails writes nothing.
      async function* failing() {
        yield "never written";
        throw new Error("the disk went away");
      }
      await assert.rejects(ws.files.upload("/tmp/z", failing()), /the disk went away/);
      await assert.rejects(ws.files.stat("/tmp/z"), (err: unknown) => err instanceof KibotosError && err.code === Code.NotFound);
    });
  });
});
