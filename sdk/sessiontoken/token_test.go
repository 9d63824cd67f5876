package sessiontoken

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The key, clock and claims the tests sign and verify under.
var (
	testKey    = []byte(strings.Repeat("k", KeySize))
	testNow    = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	testClaims = Claims{SessionID: "ses_1", WorkspaceID: "ws_a", Generation: 2, ExpiresAt: testNow.Add(time.Hour)}
)

func TestVerify(t *testing.T) {
	key, now, claims := testKey, testNow, testClaims
	good := Sign(key, claims)
	auth := Authority{WorkspaceID: "ws_a", Generation: 2, Key: key, Revoked: []string{"ses_0"}}

	tok, err := Parse(good)
	if err != nil || tok.Claims != claims {
		t.Fatalf("Parse = %+v, %v", tok.Claims, err)
	}
	if err := tok.Verify(auth, now); err != nil {
		t.Errorf("valid token: %v", err)
	}

	extended := strings.Replace(good, "."+strconv.FormatInt(claims.ExpiresAt.Unix(), 10)+".",
		"."+strconv.FormatInt(claims.ExpiresAt.Unix()+86400, 10)+".", 1)
	if extended == good {
		t.Fatal("test token has no expiry field")
	}
	with := func(edit func(*Authority)) Authority {
		a := auth
		edit(&a)
		return a
	}
	for _, c := range []struct {
		name  string
		token string
		auth  Authority
		now   time.Time
		want  error
	}{
		{"other key", good, with(func(a *Authority) { a.Key = []byte(strings.Repeat("x", KeySize)) }), now, ErrInvalid},
		{"no key", good, with(func(a *Authority) { a.Key = nil }), now, ErrInvalid},
		{"other workspace", good, with(func(a *Authority) { a.WorkspaceID = "ws_b" }), now, ErrInvalid},
		{"other generation", good, with(func(a *Authority) { a.Generation = 3 }), now, ErrInvalid},
		{"claims changed", strings.Replace(good, ".2.", ".3.", 1), with(func(a *Authority) { a.Generation = 3 }), now, ErrInvalid},
		{"expiry extended", extended, auth, now, ErrInvalid},
		{"at expiry", good, auth, now.Add(time.Hour), ErrExpired},
		{"revoked", good, with(func(a *Authority) { a.Revoked = []string{"ses_0", "ses_1"} }), now, ErrRevoked},
		{"expired and revoked", good, with(func(a *Authority) { a.Revoked = []string{"ses_1"} }), now.Add(2 * time.Hour), ErrExpired},
	} {
		tok, err := Parse(c.token)
		if err == nil {
			err = tok.Verify(c.auth, c.now)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	key := []byte(strings.Repeat("k", KeySize))
	good := Sign(key, Claims{SessionID: "ses_1", WorkspaceID: "ws_a", Generation: 2, ExpiresAt: time.Unix(1e9, 0)})
	for _, s := range []string{
		"", "garbage", "tok_abc.secret", "a.b.c.d", good + ".x",
		strings.Replace(good, ".2.", ".02.", 1),
		strings.Replace(good, ".2.", ".-2.", 1),
		strings.Replace(good, "ses_1", "", 1),
		good[:len(good)-2],
		good + "=",
		strings.Repeat("a", 600),
	} {
		if _, err := Parse(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid", s, err)
		}
	}
}
