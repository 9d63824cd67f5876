package meta

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzLabelsAndAnnotations feeds the label, selector and annotation
// validators one caller-given entry: what they accept follows the
// Kubernetes rules they document, and they agree with each other.
func FuzzLabelsAndAnnotations(f *testing.F) {
	for _, kv := range [][2]string{
		{"team", "net"}, {"example.com/team", "a.b-c_d"}, {"a", ""},
		{"", "x"}, {"-bad", "x"}, {"team", "-bad"}, {"Team", strings.Repeat("v", 63)},
		{"team", strings.Repeat("v", 64)}, {strings.Repeat("k", 64), "v"},
		{"example.com/", "v"}, {"a/b/c", "v"}, {"note", "any text\nwith lines"},
		{"note", "nul\x00inside"}, {"note", "\xff"}, {"ünïcode", "v"},
	} {
		f.Add(kv[0], kv[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		m := map[string]string{k: v}
		labelErr := ValidateLabels(m)
		if (labelErr == nil) != (ValidateSelector(m) == nil) {
			t.Fatalf("labels and selector disagree on %q=%q: %v", k, v, labelErr)
		}
		if labelErr == nil {
			// A label value is at most 63 characters of [A-Za-z0-9._-];
			// a key is a qualified name of at most 253+1+63 ASCII bytes.
			if len(v) > 63 || strings.Trim(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != "" {
				t.Fatalf("label value %q accepted", v)
			}
			if k == "" || len(k) > 253+1+63 || strings.Count(k, "/") > 1 {
				t.Fatalf("label key %q accepted", k)
			}
			if err := ValidateAnnotations(m); err != nil {
				t.Fatalf("a valid label %q=%q is no valid annotation: %v", k, v, err)
			}
		}
		if err := ValidateAnnotations(m); err == nil {
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 || len(k)+len(v) > MaxAnnotationsSize {
				t.Fatalf("annotation value %q accepted", v)
			}
			if ValidateLabels(map[string]string{k: ""}) != nil {
				t.Fatalf("annotation key %q accepted, which is no label key", k)
			}
		}
		if !Matches(m, m) || !Matches(m, nil) || (Matches(nil, m)) {
			t.Fatalf("Matches is wrong for %q=%q", k, v)
		}
	})
}
