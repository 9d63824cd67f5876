package oci

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadPressure(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, text string
		some, full float64
		ok         bool
	}{
		{"both", "some avg10=1.25 avg60=0.50 avg300=0.10 total=12345\nfull avg10=0.75 avg60=0.20 avg300=0.00 total=678\n", 1.25, 0.75, true},
		{"idle", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, 0, true},
		{"no full line", "some avg10=1.00 avg60=0.00 avg300=0.00 total=1\n", 0, 0, false},
		{"not a number", "some avg10=x avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0, 0, false},
		{"empty", "", 0, 0, false},
	} {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		some, full, err := readPressure(path)
		if (err == nil) != c.ok || some != c.some || full != c.full {
			t.Errorf("%s: %v, %v, %v; want %v, %v, success %v", c.name, some, full, err, c.some, c.full, c.ok)
		}
	}
	// A kernel that keeps no pressure per cgroup has no file: no pressure.
	if some, full, err := readPressure(filepath.Join(dir, "absent")); err != nil || some != 0 || full != 0 {
		t.Errorf("absent file: %v, %v, %v", some, full, err)
	}
}
