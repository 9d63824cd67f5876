package sessiontoken

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzParse feeds Parse and Verify the bearer strings a data-plane caller
// may present: Parse accepts only the canonical five-field shape, and only
// a token signed under the key verifies.
func FuzzParse(f *testing.F) {
	key, now := testKey, testNow
	f.Add(Sign(key, testClaims))
	f.Add(Sign(key, Claims{SessionID: "ses_2", WorkspaceID: "ws_a", Generation: 0, ExpiresAt: now.Add(-time.Hour)}))
	f.Add("ses_1.ws_a.02.1700000000.AAAA")
	f.Add("ses_1.ws_a.2.-1." + strings.Repeat("A", 43))
	f.Add("....")
	f.Add("")
	f.Add(strings.Repeat(".", 600))
	auth := Authority{WorkspaceID: "ws_a", Generation: 2, Key: key, Revoked: []string{"ses_0"}}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse(%q) = %v, want ErrInvalid", s, err)
			}
			return
		}
		// What parses is canonical: its claims render as its first four
		// fields.
		resigned := Sign(key, tok.Claims)
		if body := s[:strings.LastIndex(s, ".")]; body != resigned[:strings.LastIndex(resigned, ".")] {
			t.Fatalf("Parse(%q) accepted a non-canonical body; claims render as %q", s, resigned)
		}
		err = tok.Verify(auth, now)
		if err == nil || errors.Is(err, ErrExpired) || errors.Is(err, ErrRevoked) {
			// Authentic: the MAC is the one Sign makes.
			want, _ := Parse(resigned)
			if string(tok.mac) != string(want.mac) {
				t.Fatalf("Verify accepted %q with a MAC Sign does not make", s)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("Verify(%q) = %v", s, err)
		}
		if err := tok.Verify(Authority{WorkspaceID: auth.WorkspaceID, Generation: auth.Generation}, now); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Verify(%q) without a key = %v, want ErrInvalid", s, err)
		}
	})
}
