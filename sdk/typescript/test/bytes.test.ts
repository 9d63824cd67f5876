import assert from "node:assert/strict";
import { test } from "node:test";
import { PassThrough } from "node:stream";
import { concat, Rereadable, taken } from "../src/bytes.js";

/** counted is a streamed source of n chunks of size bytes (chunk i filled with i) that counts its reads. */
function counted(n: number, size: number) {
  const reads = { starts: 0, chunks: 0 };
  async function* source() {
    reads.starts++;
    for (let i = 0; i < n; i++) {
      reads.chunks++;
      yield new Uint8Array(size).fill(i);
    }
  }
  return { source: source(), reads };
}

async function readAll(it: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const c of it) parts.push(c);
  return concat(parts);
}

test("a second attempt reads the source from its start, which is read once", async () => {
  const { source, reads } = counted(5, 4);
  const r = new Rereadable(source, 4, 64);
  const first = r.attempt()[Symbol.asyncIterator]();
  await first.next();
  await first.next();
  assert.equal(await r.restart(), true); // the first attempt was refused after two chunks
  await assert.rejects(first.next(), /sent again/, "a restarted attempt reads no more");
  const whole = await readAll(r.attempt());
  assert.deepEqual([...whole], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]);
  assert.deepEqual(reads, { starts: 1, chunks: 5 });
  r.close();
});

test("a read the earlier attempt left running reaches the next attempt in its place", async () => {
  const { source } = counted(3, 2);
  const r = new Rereadable(source, 2, 64);
  const first = r.attempt()[Symbol.asyncIterator]();
  void first.next(); // still reading when the attempt is refused
  assert.equal(await r.restart(), true);
  assert.deepEqual([...(await readAll(r.attempt()))], [0, 0, 1, 1, 2, 2]);
});

test("past its bound a source is not read again from its start", async () => {
  const { source } = counted(4, 4);
  const r = new Rereadable(source, 4, 8);
  const first = r.attempt()[Symbol.asyncIterator]();
  await first.next();
  await first.next();
  await first.next();
  assert.equal(await r.restart(), false, "12 bytes read, over the bound");
});

test("a source that fails under a refused attempt fails the restart, not the file", async () => {
  async function* failing() {
    yield new Uint8Array(4).fill(1);
    await new Promise((r) => setTimeout(r, 50));
    throw new Error("the source broke");
  }
  const r = new Rereadable(failing(), 4, 64);
  const first = r.attempt()[Symbol.asyncIterator]();
  await first.next();
  void first.next().catch(() => undefined); // still reading when the attempt is refused
  await assert.rejects(r.restart(), /the source broke/);
});

test("a restart gives up when its signal aborts", async () => {
  async function* stalls() {
    yield new Uint8Array(4);
    await new Promise(() => undefined);
  }
  const r = new Rereadable(stalls(), 4, 64);
  const first = r.attempt()[Symbol.asyncIterator]();
  await first.next();
  void first.next();
  const stop = new AbortController();
  setTimeout(() => stop.abort(new Error("aborted")), 50);
  await assert.rejects(r.restart(stop.signal), /aborted/);
});

test("a source read to its end is not read again", async () => {
  let afterEnd = 0;
  const once: AsyncIterable<Uint8Array> = {
    [Symbol.asyncIterator]() {
      let i = 0;
      return {
        next: async () => {
          if (i < 2) return { value: new Uint8Array(4).fill(i++), done: false };
          if (i++ > 2) afterEnd++;
          return { value: undefined, done: true };
        },
      };
    },
  };
  const r = new Rereadable(once, 4, 64);
  await readAll(r.attempt());
  assert.equal(await r.restart(), true);
  assert.deepEqual([...(await readAll(r.attempt()))], [0, 0, 0, 0, 1, 1, 1, 1]);
  assert.equal(afterEnd, 0, "the source was read after its end");
});

test("taken lets go of a Node.js stream when the call ends, taking nothing a waiting read did not get", async () => {
  const events = ["error", "readable", "end", "close"];
  const listeners = (s: PassThrough) => events.map((e) => s.listenerCount(e));
  const s = new PassThrough();
  const call = new AbortController();
  const it = (taken(s, call.signal) as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
  s.write("first");
  assert.equal(Buffer.from((await it.next()).value).toString(), "first");
  const waiting = it.next(); // the stream has nothing to give
  call.abort();
  await assert.rejects(waiting, /the call that took the stream has ended/);
  assert.deepEqual(listeners(s), [0, 0, 0, 0]);
  s.end("second");
  assert.equal(Buffer.concat(await s.toArray()).toString(), "second", "the stream keeps what the call did not read");
});

test("taken throws at the first read what the stream emitted before it", async () => {
  const s = new PassThrough();
  const call = new AbortController();
  const src = taken(s, call.signal);
  s.destroy(new Error("broke before the read"));
  await new Promise((resolve) => setImmediate(resolve)); // 'error' is emitted on a later tick
  await assert.rejects(readAll(src as AsyncIterable<Uint8Array>), /broke before the read/);
  call.abort();
  assert.equal(s.listenerCount("error"), 0);
});
