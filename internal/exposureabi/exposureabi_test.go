package exposureabi

import (
	"strings"
	"testing"
)

func TestToken(t *testing.T) {
	tok, sum := NewToken("exp_a")
	if !Verify(tok, "exp_a", sum) {
		t.Fatalf("a new token %q does not verify", tok)
	}
	_, secret, _ := strings.Cut(tok, ".")
	for name, c := range map[string]struct{ token, id string }{
		"another exposure's ID": {"exp_b." + secret, "exp_b"},
		"asked for another":     {tok, "exp_b"},
		"another secret":        {"exp_a." + secret + "x", "exp_a"},
		"no secret":             {"exp_a.", "exp_a"},
		"no dot":                {"exp_a", "exp_a"},
		"empty":                 {"", "exp_a"},
	} {
		if Verify(c.token, c.id, sum) {
			t.Errorf("%s: %q verifies for %s", name, c.token, c.id)
		}
	}
	if Verify(tok, "exp_a", nil) {
		t.Error("a token verifies without a hash")
	}
}

func TestHostLabel(t *testing.T) {
	ws := "ws_0abcdefghjkmnpqrstvwxyz0"
	label := HostLabel(8080, ws)
	if label != "8080-ws-0abcdefghjkmnpqrstvwxyz0" {
		t.Fatalf("label %q", label)
	}
	if port, id, ok := ParseHostLabel(label); !ok || port != 8080 || id != ws {
		t.Errorf("ParseHostLabel(%q) = %d, %q, %v", label, port, id, ok)
	}
	for _, bad := range []string{"", "8080", "8080-ws", "8080-ws-", "0-ws-a", "65536-ws-a", "08080-ws-a", "x-ws-a", "80-ws-a-b", "-ws-a"} {
		if _, _, ok := ParseHostLabel(bad); ok {
			t.Errorf("ParseHostLabel(%q) accepted", bad)
		}
	}
}

func TestURL(t *testing.T) {
	for _, c := range []struct{ endpoint, domain, want string }{
		{"http://127.0.0.1:8870", "", "http://127.0.0.1:8870/x/exp_a/"},
		{"https://k.example.com/", "", "https://k.example.com/x/exp_a/"},
		{"http://127.0.0.1:8870", "apps.example.test", "http://22-ws-b.apps.example.test:8870/"},
		{"https://k.example.com", "apps.example.com", "https://22-ws-b.apps.example.com/"},
	} {
		if got, err := URL(c.endpoint, c.domain, "exp_a", "ws_b", 22); err != nil || got != c.want {
			t.Errorf("URL(%q, %q) = %q, %v; want %q", c.endpoint, c.domain, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:8870", "ftp://x", "http://"} {
		if got, err := URL(bad, "", "exp_a", "ws_b", 22); err == nil {
			t.Errorf("URL(%q) = %q", bad, got)
		}
	}
}
