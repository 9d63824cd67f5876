// dataplane measures the TypeScript SDK against a live deployment
// (KIBOTOS_URL, KIBOTOS_TOKEN): the round trip of `exec true` after a
// warm-up that issues the session, and writing and reading a file of
// FILE_MIB (default 64) MiB through files.upload and files.download.
import { randomBytes } from "node:crypto";
import { Kibotos } from "../src/index.js";

const MIB = 1024 * 1024;
const runs = Number(process.env.RUNS ?? 200);
const fileMiB = Number(process.env.FILE_MIB ?? 64);

const kb = Kibotos.connect({ url: process.env.KIBOTOS_URL!, token: process.env.KIBOTOS_TOKEN! });
const ws = await kb.createWorkspace({ memoryBytes: 512 * MIB, diskBytes: (fileMiB + 256) * MIB });
try {
  await ws.exec(["true"]);
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await ws.exec(["true"]);
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  const pct = (p: number) => times[Math.min(times.length - 1, Math.floor((p / 100) * times.length))].toFixed(1);
  console.log(`exec true round trip (n=${runs}): p50 ${pct(50)} ms, p99 ${pct(99)} ms`);

  const block = randomBytes(MIB);
  async function* source() {
    for (let i = 0; i < fileMiB; i++) yield block;
  }
  let t = performance.now();
  await ws.files.upload("/root/bench", source());
  const up = fileMiB / ((performance.now() - t) / 1000);
  t = performance.now();
  let n = 0;
  for await (const b of ws.files.download("/root/bench")) n += b.length;
  const down = fileMiB / ((performance.now() - t) / 1000);
  if (n !== fileMiB * MIB) throw new Error(`read ${n} bytes, want ${fileMiB * MIB}`);
  console.log(`file of ${fileMiB} MiB: upload ${up.toFixed(0)} MiB/s, download ${down.toFixed(0)} MiB/s`);
} finally {
  await ws.delete();
  kb.close();
}
