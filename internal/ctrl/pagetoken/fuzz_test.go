package pagetoken

import (
	"encoding/base64"
	"errors"
	"testing"
)

// FuzzDecode feeds Decode tokens a caller may send: whatever it accepts is
// a token this key signed for this very list, and nothing else passes.
func FuzzDecode(f *testing.F) {
	c := New([]byte("fuzz key"))
	scope := Scope{Kind: "egress", ProjectID: "prj_1", Selector: map[string]string{"team": "net"}}
	f.Add(c.Encode(scope, "egr_123"), "egress", "prj_1", "team", "net")
	f.Add(c.Encode(scope, ""), "egress", "prj_1", "team", "net")
	f.Add(c.Encode(Scope{Kind: "volume", ProjectID: "prj_2"}, "vol_9"), "volume", "prj_2", "", "")
	f.Add("", "egress", "prj_1", "", "")
	f.Add("not base64!", "egress", "prj_1", "team", "net")
	f.Add("AAAA", "resolver", "prj_1", "a", "1")
	f.Fuzz(func(t *testing.T, token, kind, project, key, value string) {
		s := Scope{Kind: kind, ProjectID: project}
		if key != "" {
			s.Selector = map[string]string{key: value}
		}
		after, err := c.Decode(s, token)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode(%q) = %v, want ErrInvalid", token, err)
			}
		} else {
			// Only a signed token passes: its bytes are the cursor and its MAC.
			raw, _ := base64.RawURLEncoding.DecodeString(token)
			if want, _ := base64.RawURLEncoding.DecodeString(c.Encode(s, after)); string(raw) != string(want) {
				t.Fatalf("Decode accepted %q, which this Codec did not issue for %+v", token, s)
			}
			if _, err := New([]byte("another key")).Decode(s, token); err == nil {
				t.Fatalf("another key accepts %q", token)
			}
			other := Scope{Kind: kind + "x", ProjectID: project, Selector: s.Selector}
			if _, err := c.Decode(other, token); err == nil {
				t.Fatalf("another kind accepts %q", token)
			}
		}
		// Any cursor round-trips in its own scope.
		if got, err := c.Decode(s, c.Encode(s, token)); err != nil || got != token {
			t.Fatalf("round trip of %q = %q, %v", token, got, err)
		}
	})
}
