package psi

import "time"

// Thresholds say when a cgroup's memory is saturated and when saturation
// has lasted long enough to kill a process.
type Thresholds struct {
	// Window is the span over which the share of full stall is measured.
	Window time.Duration
	// SaturatedPermille is the share of the window, in thousandths, during
	// which every task was stalled on memory at or above which the
	// memory is saturated.
	SaturatedPermille uint32
	// KillAfter is how long saturation lasts before a kill is called for.
	KillAfter time.Duration
}

// DefaultThresholds are what a zero field of Thresholds stands for:
// saturated when every task was stalled on memory for at least half of 10
// seconds, and a kill once that has lasted 20 seconds.
var DefaultThresholds = Thresholds{Window: 10 * time.Second, SaturatedPermille: 500, KillAfter: 20 * time.Second}

// OrDefaults returns t with each zero field replaced by DefaultThresholds'.
func (t Thresholds) OrDefaults() Thresholds {
	if t.Window == 0 {
		t.Window = DefaultThresholds.Window
	}
	if t.SaturatedPermille == 0 {
		t.SaturatedPermille = DefaultThresholds.SaturatedPermille
	}
	if t.KillAfter == 0 {
		t.KillAfter = DefaultThresholds.KillAfter
	}
	return t
}

// Sample is one reading of a cgroup's memory.pressure.
type Sample struct {
	// At is when it was read.
	At time.Time
	// Full is the full stall total read (Pressure.Full.Total).
	Full time.Duration
}

// Judgment is what a Monitor concludes from its samples.
type Judgment struct {
	// At is the time of the latest sample, which the judgment is of.
	At time.Time
	// Saturated is true when, over the latest window, every task was
	// stalled on memory for at least the saturated share of the time.
	Saturated bool
	// Since is when saturation began: the time of the first sample of the
	// current run of saturated judgments. Zero unless Saturated.
	Since time.Time
	// FullPermille is the share of Window, in thousandths, during which
	// every task was stalled on memory.
	FullPermille uint32
	// Window is the span FullPermille covers: from the newest sample at
	// least Thresholds.Window old to the latest. Zero (and the memory not
	// saturated) until the samples span a window.
	Window time.Duration
	// Kill is true when saturation has lasted Thresholds.KillAfter since
	// it began and since the latest kill, and the window lies wholly after
	// that kill.
	Kill bool
}

// SaturatedFor is how long saturation had lasted at the judgment's
// latest sample; zero unless Saturated.
func (j Judgment) SaturatedFor() time.Duration {
	if !j.Saturated {
		return 0
	}
	return j.At.Sub(j.Since)
}

// Monitor judges one cgroup's memory from successive samples of its full
// stall total. The zero Monitor is not usable; see NewMonitor. It is not
// safe for concurrent use.
type Monitor struct {
	th Thresholds
	// samples are oldest first: the newest at least a window older than
	// the latest, and every later one.
	samples []Sample
	// since is when the current saturation began; zero when not
	// saturated.
	since time.Time
	// killed is when the latest kill was made; zero before any.
	killed time.Time
}

// NewMonitor returns a Monitor with th (zero fields take the defaults).
func NewMonitor(th Thresholds) *Monitor {
	return &Monitor{th: th.OrDefaults()}
}

// Observe adds a sample and judges. A sample not later than the previous
// one is ignored (the judgment is made again from the samples kept); a
// total lower than the previous one (a counter that restarted) starts the
// samples over.
func (m *Monitor) Observe(s Sample) Judgment {
	m.add(s)
	latest := m.samples[len(m.samples)-1]
	j := Judgment{At: latest.At}
	base, ok := m.base(latest.At)
	if !ok {
		m.since = time.Time{}
		return j
	}
	j.Window = latest.At.Sub(base.At)
	j.FullPermille = uint32(min(1000, (latest.Full-base.Full)*1000/j.Window))
	if j.FullPermille < m.th.SaturatedPermille {
		m.since = time.Time{}
		return j
	}
	if m.since.IsZero() {
		m.since = latest.At
	}
	j.Saturated, j.Since = true, m.since
	from := m.since
	if m.killed.After(from) {
		from = m.killed
	}
	j.Kill = latest.At.Sub(from) >= m.th.KillAfter && !base.At.Before(m.killed)
	return j
}

// add appends s to the samples, unless it is not later than the latest.
func (m *Monitor) add(s Sample) {
	if n := len(m.samples); n > 0 {
		last := m.samples[n-1]
		if !s.At.After(last.At) {
			return
		}
		if s.Full < last.Full {
			m.samples, m.since = m.samples[:0], time.Time{}
		}
	}
	m.samples = append(m.samples, s)
}

// base drops the samples older than needed and returns the newest sample
// at least a window older than at; ok is false while the samples do not
// span a window.
func (m *Monitor) base(at time.Time) (Sample, bool) {
	i := -1
	for k, s := range m.samples {
		if at.Sub(s.At) >= m.th.Window {
			i = k
		}
	}
	if i < 0 {
		return Sample{}, false
	}
	m.samples = m.samples[i:]
	return m.samples[0], true
}

// Killed records that a kill was made (or tried) at at, as the latest
// judgment called for: the next is called for only once saturation has
// lasted Thresholds.KillAfter more, over a window wholly after at.
func (m *Monitor) Killed(at time.Time) {
	m.killed = at
}
