// The README's TypeScript example, run as it is.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { promisify } from "node:util";
import { deployment } from "./env.js";

test("the quickstart example runs", async () => {
  const script = fileURLToPath(new URL("../examples/quickstart.js", import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [script], {
    env: { ...process.env, KIBOTOS_URL: deployment().url, KIBOTOS_TOKEN: deployment().token },
  });
  assert.match(stdout, /^hello from \S+\nexit code 0\nprint\(1\)\n\n$/);
});
