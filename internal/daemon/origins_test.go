package daemon

import (
	"slices"
	"testing"
)

func TestParseOrigins(t *testing.T) {
	got, err := ParseOrigins(" https://console.example.com/, http://127.0.0.1:8870 ,")
	if err != nil || !slices.Equal(got, []string{"https://console.example.com", "http://127.0.0.1:8870"}) {
		t.Errorf("ParseOrigins: %v, %v", got, err)
	}
	for _, bad := range []string{"console.example.com", "ftp://x", "https://x/console", "https://u@x", "https://x?a=1"} {
		if _, err := ParseOrigins(bad); err == nil {
			t.Errorf("ParseOrigins(%q) accepted it", bad)
		}
	}
	if got := consoleOrigins(nil, "https://ctrl.example.com:8443/base"); !slices.Equal(got, []string{"https://ctrl.example.com:8443"}) {
		t.Errorf("the default origin: %v", got)
	}
	if got := consoleOrigins([]string{"https://a"}, "https://ctrl.example.com"); !slices.Equal(got, []string{"https://a"}) {
		t.Errorf("configured origins: %v", got)
	}
}
