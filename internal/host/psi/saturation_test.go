package psi

import (
	"testing"
	"time"
)

// stallSeries feeds a Monitor samples one second apart, each second
// stalled for the given share (permille), and returns the judgment after
// each.
type stallSeries struct {
	m     *Monitor
	t0    time.Time
	at    time.Time
	total time.Duration
}

func newSeries(th Thresholds) *stallSeries {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &stallSeries{m: NewMonitor(th), t0: t0, at: t0}
}

// run adds n seconds stalled permille each, one sample per second, and
// returns the judgments.
func (s *stallSeries) run(n int, permille int) []Judgment {
	var js []Judgment
	for range n {
		s.at = s.at.Add(time.Second)
		s.total += time.Duration(permille) * time.Millisecond
		js = append(js, s.m.Observe(Sample{At: s.at, Full: s.total}))
	}
	return js
}

// second is the time of the sample n seconds after the first sample.
func (s *stallSeries) second(n int) time.Time { return s.t0.Add(time.Duration(n+1) * time.Second) }

var testThresholds = Thresholds{Window: 4 * time.Second, SaturatedPermille: 500, KillAfter: 6 * time.Second}

// TestMonitorWindow: nothing is judged before the samples span a window;
// then the share is that of the window, measured from the newest sample
// at least a window old.
func TestMonitorWindow(t *testing.T) {
	s := newSeries(testThresholds)
	for i, j := range s.run(4, 1000) {
		if j.Saturated || j.Window != 0 || j.Kill {
			t.Errorf("sample %d, before a window: %+v", i, j)
		}
	}
	j := s.run(1, 1000)[0]
	if !j.Saturated || j.Window != 4*time.Second || j.FullPermille != 1000 || !j.Since.Equal(s.second(4)) {
		t.Errorf("after a window of full stall: %+v", j)
	}
	// Two seconds stalled half, two not at all: a quarter of the window.
	s.run(2, 500)
	j = s.run(2, 0)[1]
	if j.Saturated || j.FullPermille != 250 || j.Window != 4*time.Second || !j.Since.IsZero() {
		t.Errorf("a quarter of the window: %+v", j)
	}
}

// TestMonitorSparseSamples: with samples further apart than the window,
// the window covers the span since the previous one.
func TestMonitorSparseSamples(t *testing.T) {
	m := NewMonitor(testThresholds)
	t0 := time.Unix(1000, 0)
	m.Observe(Sample{At: t0, Full: 0})
	j := m.Observe(Sample{At: t0.Add(10 * time.Second), Full: 6 * time.Second})
	if !j.Saturated || j.Window != 10*time.Second || j.FullPermille != 600 {
		t.Errorf("a sparse window: %+v", j)
	}
}

// TestMonitorThreshold: the share at the threshold saturates, just below
// it does not.
func TestMonitorThreshold(t *testing.T) {
	for _, c := range []struct {
		permille int
		want     bool
	}{{499, false}, {500, true}, {1000, true}, {0, false}} {
		j := newSeries(testThresholds).run(5, c.permille)[4]
		if j.Saturated != c.want || j.FullPermille != uint32(c.permille) {
			t.Errorf("%d‰ stalled: %+v, want saturated %v", c.permille, j, c.want)
		}
	}
	// A lower threshold saturates where the default does not.
	if j := newSeries(Thresholds{Window: 4 * time.Second, SaturatedPermille: 100}).run(5, 150)[4]; !j.Saturated {
		t.Errorf("150‰ with a 100‰ threshold: %+v", j)
	}
}

// TestMonitorSustained: saturation keeps its start while it lasts, a kill
// is called for once it has lasted KillAfter, and it clears once the
// window's share falls below the threshold.
func TestMonitorSustained(t *testing.T) {
	s := newSeries(testThresholds)
	s.run(4, 1000)
	js := s.run(7, 1000) // saturated from second 4 to 10
	for i, j := range js[:6] {
		if !j.Saturated || !j.Since.Equal(s.second(4)) || j.Kill {
			t.Errorf("second %d: %+v, want saturated since second 4, no kill yet", 4+i, j)
		}
	}
	if j := js[6]; !j.Kill || j.SaturatedFor() != 6*time.Second {
		t.Errorf("after 6 s saturated: %+v, want a kill", j)
	}
	// Demand falls: the window still holds enough stall for two more
	// seconds, then clears.
	js = s.run(3, 0)
	if !js[0].Saturated || !js[1].Saturated || js[2].Saturated || !js[2].Since.IsZero() || js[2].SaturatedFor() != 0 {
		t.Errorf("clearing: %+v", js)
	}
	// Saturated again: a new start, and a new KillAfter.
	js = s.run(10, 1000)
	if j := js[1]; !j.Saturated || !j.Since.Equal(s.second(15)) {
		t.Errorf("saturated again: %+v, want since second 15", j)
	}
	if js[6].Kill || !js[7].Kill {
		t.Errorf("kill after saturating again: %+v %+v", js[6], js[7])
	}
}

// TestMonitorAfterKill: after a kill the next one waits KillAfter more
// and for a window wholly after the kill, while saturation keeps its
// start.
func TestMonitorAfterKill(t *testing.T) {
	th := testThresholds
	th.KillAfter = 2 * time.Second
	s := newSeries(th)
	s.run(4, 1000)
	js := s.run(3, 1000)
	if !js[2].Kill {
		t.Fatalf("no kill after 2 s saturated: %+v", js[2])
	}
	s.m.Killed(js[2].At)
	js = s.run(4, 1000)
	for i, j := range js[:3] {
		if j.Kill || !j.Since.Equal(s.second(4)) {
			t.Errorf("%d s after the kill: %+v, want saturated since second 4 and no kill", i+1, j)
		}
	}
	if !js[3].Kill || js[3].SaturatedFor() != 6*time.Second {
		t.Errorf("a window after the kill: %+v, want a kill", js[3])
	}
}

// TestMonitorOddSamples: a sample not later than the previous is ignored;
// a total that went back starts over.
func TestMonitorOddSamples(t *testing.T) {
	s := newSeries(testThresholds)
	s.run(5, 1000)
	j := s.m.Observe(Sample{At: s.at, Full: 0})
	if !j.Saturated || j.FullPermille != 1000 || !j.At.Equal(s.at) {
		t.Errorf("a repeated sample time: %+v", j)
	}
	j = s.m.Observe(Sample{At: s.at.Add(-time.Second), Full: 0})
	if !j.Saturated || !j.At.Equal(s.at) {
		t.Errorf("an earlier sample: %+v", j)
	}
	s.total = 0
	if j := s.run(1, 0)[0]; j.Saturated || j.Window != 0 {
		t.Errorf("a restarted counter: %+v", j)
	}
	if j := s.run(4, 1000)[3]; !j.Saturated || !j.Since.Equal(s.second(9)) {
		t.Errorf("a window after the restart: %+v", j)
	}
}

// TestThresholdsOrDefaults: zero fields take the defaults, others stay.
func TestThresholdsOrDefaults(t *testing.T) {
	if got := (Thresholds{}).OrDefaults(); got != DefaultThresholds {
		t.Errorf("zero: %+v", got)
	}
	th := Thresholds{Window: time.Second, SaturatedPermille: 1, KillAfter: time.Minute}
	if got := th.OrDefaults(); got != th {
		t.Errorf("set: %+v", got)
	}
}
