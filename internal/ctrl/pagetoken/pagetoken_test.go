package pagetoken

import (
	"errors"
	"testing"
)

func TestRoundTripAndBinding(t *testing.T) {
	c := New([]byte("key"))
	scope := Scope{Kind: "egress", ProjectID: "p1", Selector: map[string]string{"a": "1", "b": "2"}}
	tok := c.Encode(scope, "egr_123")
	got, err := c.Decode(Scope{Kind: "egress", ProjectID: "p1", Selector: map[string]string{"b": "2", "a": "1"}}, tok)
	if err != nil || got != "egr_123" {
		t.Fatalf("Decode = %q, %v", got, err)
	}
	others := map[string]Scope{
		"other selector value": {Kind: "egress", ProjectID: "p1", Selector: map[string]string{"a": "1", "b": "3"}},
		"fewer selector keys":  {Kind: "egress", ProjectID: "p1", Selector: map[string]string{"a": "1"}},
		"no selector":          {Kind: "egress", ProjectID: "p1"},
		"shifted boundary":     {Kind: "egress", ProjectID: "p1", Selector: map[string]string{"a": "1b", "": "2"}},
		"other project":        {Kind: "egress", ProjectID: "p2", Selector: scope.Selector},
		"other kind":           {Kind: "resolver", ProjectID: "p1", Selector: scope.Selector},
	}
	for name, s := range others {
		if _, err := c.Decode(s, tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Decode err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := New([]byte("other key")).Decode(scope, tok); !errors.Is(err, ErrInvalid) {
		t.Errorf("other key: err = %v", err)
	}
}

func TestTamperedTokensAreRefused(t *testing.T) {
	c := New([]byte("key"))
	scope := Scope{Kind: "egress", ProjectID: "p1"}
	tok := c.Encode(scope, "egr_123")
	for i := range len(tok) {
		b := []byte(tok)
		b[i] ^= 0x01
		if _, err := c.Decode(scope, string(b)); err == nil {
			t.Errorf("token with byte %d flipped was accepted", i)
		}
	}
	for _, bad := range []string{"", "x", "!!!!", tok + "A", tok[:len(tok)-1]} {
		if _, err := c.Decode(scope, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Decode(%q) err = %v", bad, err)
		}
	}
}
