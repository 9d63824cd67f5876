// Where an API error goes in a form: next to the field its message names.
import { apiError, errorText, type ApiError } from "./api.js";
import { setError } from "./dom.js";

/** FieldMap pairs a pattern of the server's messages with the id of the control it concerns. */
export type FieldMap = [RegExp, string][];

/**
 * showError puts the server's error next to the field its message names,
 * else in the form's own error slot (formId). It returns the error.
 */
export function showError(e: unknown, fields: FieldMap, formId: string): ApiError {
  const err = apiError(e);
  const hit = fields.find(([re]) => re.test(err.message));
  setError(hit ? hit[1] : formId, errorText(err));
  return err;
}

/** clearErrors empties the error slots of these controls. */
export function clearErrors(ids: string[]): void {
  for (const id of ids) setError(id, "");
}
