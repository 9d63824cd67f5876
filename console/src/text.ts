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
 * WRITTEN matches the format characters that ordinary text needs and
 * that show as what they are where they stand, so visible keeps them: a
 * zero-width joiner between two emoji (a family, a profession: one
 * glyph), a zero-width non-joiner or joiner between two letters of a
 * script other than Latin, Greek or Cyrillic (Persian words, Indic
 * conjuncts), and the tag characters of a subdivision flag after U+1F3F4.
 * Between Latin letters a joiner would hide: it stays escaped.
 */
const WRITTEN =
  /(?<=[\p{Extended_Pictographic}\p{Emoji_Modifier}\uFE0F])\u200D(?=\p{Extended_Pictographic})|(?<=(?![\p{Script=Latin}\p{Script=Greek}\p{Script=Cyrillic}])[\p{L}\p{M}])[\u200C\u200D](?=(?![\p{Script=Latin}\p{Script=Greek}\p{Script=Cyrillic}])[\p{L}\p{M}])|(?<=\u{1F3F4}[\u{E0020}-\u{E007E}]*)[\u{E0020}-\u{E007F}]/uy;

/**
 * visible is text the console did not choose (a file name, a token's
 * name, a guest's message) with each character UNSEEN matches (but those
 * WRITTEN keeps) written as its escape, \u202E (\u{E0041} beyond U+FFFF),
 * and a backslash as \\, so that a name cannot pose as another's escape:
 * two names that differ in such characters never look the same, and none
 * turns the text after it around. With escapeBackslash false a backslash stays as it is (a
 * server's message, which quotes names with Go's escapes already).
 */
export function visible(text: string, escapeBackslash = true): string {
  return text.replace(escapeBackslash ? UNSEEN_OR_BACKSLASH : UNSEEN, (c, at: number) => {
    if (c === "\\") return "\\\\";
    if (isWritten(text, at)) return c;
    const n = c.codePointAt(0)!.toString(16).toUpperCase();
    return n.length > 4 ? `\\u{${n}}` : `\\u${n.padStart(4, "0")}`;
  });
}

/** isWritten reports whether the character of text at index at is one WRITTEN keeps. */
function isWritten(text: string, at: number): boolean {
  WRITTEN.lastIndex = at;
  return WRITTEN.test(text);
}
