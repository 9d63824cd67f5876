package psi

import (
	"testing"
	"time"
)

// TestParse: both lines of a memory.pressure file, a cpu.pressure file
// without a full line, and refusals of what is not a PSI file.
func TestParse(t *testing.T) {
	p, err := Parse([]byte("some avg10=12.50 avg60=3.25 avg300=0.75 total=15280944\nfull avg10=10.00 avg60=2.00 avg300=0.50 total=11495870\n"))
	want := Pressure{
		Some: Line{Avg10: 12.5, Avg60: 3.25, Avg300: 0.75, Total: 15280944 * time.Microsecond},
		Full: Line{Avg10: 10, Avg60: 2, Avg300: 0.5, Total: 11495870 * time.Microsecond},
	}
	if err != nil || p != want {
		t.Errorf("Parse = %+v, %v; want %+v", p, err, want)
	}
	p, err = Parse([]byte("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"))
	if err != nil || p.Some.Total != 42*time.Microsecond || p.Full != (Line{}) {
		t.Errorf("Parse without a full line = %+v, %v", p, err)
	}
	for _, bad := range []string{
		"",
		"full avg10=0.00 avg60=0.00 avg300=0.00 total=0",
		"some avg10=0.00 avg60=0.00 avg300=0.00",
		"some avg10=x avg60=0.00 avg300=0.00 total=0",
		"some avg10=0.00 total=-1",
		"some total",
		"some total=1\nhalf total=1",
	} {
		if p, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", bad, p)
		}
	}
}
