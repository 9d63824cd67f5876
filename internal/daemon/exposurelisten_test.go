package daemon

import "testing"

func TestExposureAddress(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8870":  "127.0.0.1:8871",
		":8870":           ":8871",
		"[::1]:9000":      "[::1]:9001",
		"127.0.0.1:0":     "127.0.0.1:0", // the system's choice, for both
		"127.0.0.1:65535": "",
		"127.0.0.1:http":  "",
	} {
		got, err := exposureAddress(listen)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("exposureAddress(%q) = %q, %v; want %q", listen, got, err, want)
		}
	}
}
