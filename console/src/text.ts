// Text the console did not choose (a file name, a token's name, a guest's
// message), written so that it shows as what it is.

/**
 * UNSEEN matches the characters that would show a string as another one,
 * or turn the text around it: control and format characters (the bidi
 * overrides, embeddings, isolates and marks, zero-width characters), line
 * and paragraph separators, and spaces other than U+0020. UNSEEN_OR_BACKSLASH
 * matches a backslash too.
 */
const UNSEEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]|(?! )\p{Zs}/gu;
const UNSEEN_OR_BACKSLASH = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\\]|(?! )\p{Zs}/gu;

/**
 * visible is text the console did not choose (a file name, a token's
 * name, a guest's message) with each character UNSEEN matches written as
 * its escape, \u202E (\u{E0041} beyond U+FFFF), and a backslash as \\, so
 * that a name cannot pose as another's escape: two names that differ in
 * such characters never look the same, and none turns the text after it
 * around. With escapeBackslash false a backslash stays as it is (a
 * server's message, which quotes names with Go's escapes already).
 */
export function visible(text: string, escapeBackslash = true): string {
  return text.replace(escapeBackslash ? UNSEEN_OR_BACKSLASH : UNSEEN, (c) => {
    if (c === "\\") return "\\\\";
    const n = c.codePointAt(0)!.toString(16).toUpperCase();
    return n.length > 4 ? `\\u{${n}}` : `\\u${n.padStart(4, "0")}`;
  });
}
