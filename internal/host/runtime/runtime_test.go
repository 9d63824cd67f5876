package runtime

import "testing"

// TestLargestProcess: the largest resident set wins, the guest agent
// (PID 1) never, ties go to the lowest PID, and with nothing but the
// agent there is no choice.
func TestLargestProcess(t *testing.T) {
	agent := GuestProcess{PID: 1, Command: "kibotos-guest", RSSBytes: 900 << 20}
	sh := GuestProcess{PID: 7, Command: "sh", RSSBytes: 80 << 20}
	cat := GuestProcess{PID: 9, Command: "cat", RSSBytes: 1 << 20}
	twin := GuestProcess{PID: 5, Command: "sh", RSSBytes: 80 << 20}
	for _, c := range []struct {
		name  string
		procs []GuestProcess
		want  GuestProcess
		ok    bool
	}{
		{"largest", []GuestProcess{cat, agent, sh}, sh, true},
		{"order does not matter", []GuestProcess{sh, cat, agent}, sh, true},
		{"tie: lowest PID", []GuestProcess{sh, twin, cat}, twin, true},
		{"only the agent", []GuestProcess{agent}, GuestProcess{}, false},
		{"none", nil, GuestProcess{}, false},
		{"no memory at all", []GuestProcess{agent, {PID: 3, Command: "sleep"}}, GuestProcess{PID: 3, Command: "sleep"}, true},
	} {
		if got, ok := LargestProcess(c.procs); got != c.want || ok != c.ok {
			t.Errorf("%s: LargestProcess = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
