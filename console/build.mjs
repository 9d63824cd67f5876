// build.mjs bundles the console (src/main.ts, its CSS and xterm.js's) with
// esbuild into ../internal/ctrl/console/dist: index.html and assets/ named by
// content hash, which the kibotos binary embeds. The generated client is
// the TypeScript SDK's (../sdk/typescript/gen); its imports resolve to
// this package's pinned node_modules, so the bundle holds one copy of each
// library.
import * as esbuild from "esbuild";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.join(here, "..", "internal", "ctrl", "console", "dist");

// Imports from the SDK's generated code resolve from here, not from
// sdk/typescript/node_modules (which may not exist, or hold another copy).
const oneCopy = {
  name: "one-copy",
  setup(build) {
    build.onResolve({ filter: /^@(bufbuild|connectrpc)\// }, (args) =>
      args.resolveDir === here ? undefined : build.resolve(args.path, { kind: args.kind, resolveDir: here }),
    );
  },
};

await rm(path.join(out, "assets"), { recursive: true, force: true });
await rm(path.join(out, "index.html"), { force: true });
await mkdir(path.join(out, "assets"), { recursive: true });
const result = await esbuild.build({
  entryPoints: [path.join(here, "src", "main.ts")],
  bundle: true,
  minify: true,
  format: "esm",
  target: ["es2022"],
  outdir: path.join(out, "assets"),
  entryNames: "[name]-[hash]",
  metafile: true,
  legalComments: "linked",
  plugins: [oneCopy],
  logLevel: "warning",
});
const outputs = Object.keys(result.metafile.outputs).map((p) => path.basename(p));
const js = outputs.find((f) => f.endsWith(".js"));
const css = outputs.find((f) => f.endsWith(".css"));
const page = (await readFile(path.join(here, "index.html"), "utf8"))
  .replace("%JS%", `/assets/${js}`)
  .replace("%CSS%", `/assets/${css}`);
await writeFile(path.join(out, "index.html"), page);
console.log(`console: ${outputs.join(", ")} and index.html in ${path.relative(process.cwd(), out)}`);
