// The deployment the tests run against: KIBOTOS_URL and KIBOTOS_TOKEN,
// which scripts/test-typescript sets after starting `kibotos up`.
import { Kibotos } from "../src/index.js";

/** deployment returns the URL and token of the deployment under test. */
export function deployment(): { url: string; token: string } {
  const url = process.env.KIBOTOS_URL;
  const token = process.env.KIBOTOS_TOKEN;
  if (!url || !token) {
    throw new Error("KIBOTOS_URL and KIBOTOS_TOKEN must name a running deployment (scripts/test-typescript starts one)");
  }
  return { url, token };
}

/** connect returns a client of the deployment under test. */
export function connect(): Kibotos {
  return Kibotos.connect(deployment());
}

/** MIB is a mebibyte. */
export const MIB = 1024 * 1024;
