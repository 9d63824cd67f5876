import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { CommandMetadataSchema, type CommandMetadata } from "../gen/kibotos/ctrl/v1/ctrl_pb.js";

/**
 * commandMetadata is the CommandMetadata of a mutating control-plane call:
 * id, or a fresh random UUID when it is empty. Retrying a call with the
 * same ID and input returns the first result again.
 */
export function commandMetadata(id?: string): CommandMetadata {
  return create(CommandMetadataSchema, { commandId: id || randomUUID() });
}
