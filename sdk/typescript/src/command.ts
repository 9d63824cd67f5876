import { create } from "@bufbuild/protobuf";
import { CommandMetadataSchema, type CommandMetadata } from "../gen/kibotos/ctrl/v1/ctrl_pb.js";

/** webcrypto is the Web Crypto API, global in browsers and Node.js 19 and later. */
const webcrypto = (globalThis as unknown as { crypto: { randomUUID(): string } }).crypto;

/**
 * commandMetadata is the CommandMetadata of a mutating control-plane call:
 * id, or a fresh random UUID when it is empty. Retrying a call with the
 * same ID and input returns the first result again.
 */
export function commandMetadata(id?: string): CommandMetadata {
  return create(CommandMetadataSchema, { commandId: id || webcrypto.randomUUID() });
}
