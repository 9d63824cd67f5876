// The README's TypeScript example, run as it is.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
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

test("README.md shows the quickstart example as it is", async () => {
  const example = await readFile(fileURLToPath(new URL("../../examples/quickstart.ts", import.meta.url)), "utf8");
  const readme = await readFile(fileURLToPath(new URL("../../../../README.md", import.meta.url)), "utf8");
  const code = example.slice(example.indexOf("import { Kibotos }"));
  assert.ok(readme.includes("```ts\n" + code + "```"), "README.md's TypeScript section differs from examples/quickstart.ts");
});
