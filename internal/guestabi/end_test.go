package guestabi

import "testing"

func TestShutdown(t *testing.T) {
	for contents, want := range map[string]bool{
		EndShutdown + "\n": true,
		EndShutdown:        true,
		EndReset + "\n":    false,
		"":                 false,
		"shutdown now":     false,
		"SHUTDOWN":         false,
	} {
		if got := Shutdown([]byte(contents)); got != want {
			t.Errorf("Shutdown(%q) = %v, want %v", contents, got, want)
		}
	}
}
