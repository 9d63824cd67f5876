package dataplane

import (
	"bytes"
	"context"
	"testing"
	"time"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// drain reads l from c until the exit or until nothing comes for a while.
func drain(t *testing.T, l *outLog, c *cursor) (out []byte, kinds []outKind, exit *datav1.ProcessEvent_Exited) {
	t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		kind, data, x, err := l.next(ctx, c)
		cancel()
		if err != nil || x != nil {
			return out, kinds, x
		}
		out = append(out, data...)
		kinds = append(kinds, kind)
	}
}

func TestOutLogReplaysRecent(t *testing.T) {
	l := newOutLog(minOutputLimit)
	// No reader: the oldest output goes to make room.
	for i := range 10 {
		l.write(outStdout, bytes.Repeat([]byte{byte('a' + i)}, maxChunk))
	}
	if l.size() > l.limit {
		t.Fatalf("log holds %d > %d", l.size(), l.limit)
	}
	l.close(&datav1.ProcessEvent_Exited{ExitCode: 1})
	c := l.attach()
	out, _, exit := drain(t, l, c)
	if len(out) == 0 || len(out) > l.limit || out[len(out)-1] != 'j' || exit.GetExitCode() != 1 {
		t.Fatalf("replayed %d bytes ending %q, exit %v", len(out), out[len(out)-1:], exit)
	}
}

func TestOutLogWaitsForReaders(t *testing.T) {
	l := newOutLog(minOutputLimit)
	c := l.attach()
	const total = 20 * maxChunk
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range total / 1000 {
			l.write(outKind(i%2), bytes.Repeat([]byte{byte(i)}, 1000))
		}
		l.close(&datav1.ProcessEvent_Exited{})
	}()
	var got []byte
	for {
		kind, data, exit, err := l.next(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if exit != nil {
			break
		}
		if len(data) == 0 || int(kind) != int(data[0])%2 {
			t.Fatalf("kind %d for data of write %d", kind, data[0])
		}
		got = append(got, data...)
		if l.size() > l.limit+maxChunk+chunkOverhead {
			t.Fatalf("log grew to %d", l.size())
		}
	}
	<-done
	if len(got) != total/1000*1000 {
		t.Fatalf("read %d of %d bytes", len(got), total/1000*1000)
	}
	for i := range len(got) / 1000 {
		if got[i*1000] != byte(i) || got[i*1000+999] != byte(i) {
			t.Fatalf("write %d out of order", i)
		}
	}
}

func TestOutLogDetachUnblocks(t *testing.T) {
	l := newOutLog(minOutputLimit)
	c := l.attach()
	done := make(chan struct{})
	go func() {
		for range 10 {
			l.write(outStdout, make([]byte, maxChunk))
		}
		close(done)
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("writer did not wait for the reader")
	default:
	}
	if !l.writerWaiting() {
		t.Fatal("writerWaiting false")
	}
	l.detach(c)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("writer still waits after the reader left")
	}
}

func TestOutLogManySmallWrites(t *testing.T) {
	l := newOutLog(minOutputLimit)
	for i := range 100000 {
		l.write(outKind(i%2), []byte{'x'}) // alternating: a chunk each
	}
	if l.size() > l.limit {
		t.Fatalf("log holds %d > %d", l.size(), l.limit)
	}
	l.discard()
	l.close(&datav1.ProcessEvent_Exited{})
	if out, _, exit := drain(t, l, l.attach()); len(out) != 0 || exit == nil {
		t.Fatalf("after discard: %d bytes, exit %v", len(out), exit)
	}
}

// TestOutLogDiscardKeepsWhatReadersNeed: the output an attached reader has
// not read yet survives a discard (the budget of ended processes' output),
// and the reader gets all of it and the exit; a reader that comes after
// gets only what was left.
func TestOutLogDiscardKeepsWhatReadersNeed(t *testing.T) {
	l := newOutLog(minOutputLimit)
	c := l.attach()
	want := bytes.Repeat([]byte("0123456789abcdef"), minOutputLimit/32)
	l.write(outStdout, want)
	l.close(&datav1.ProcessEvent_Exited{ExitCode: 3})
	l.discard()
	if out, _, exit := drain(t, l, c); !bytes.Equal(out, want) || exit.GetExitCode() != 3 {
		t.Errorf("the attached reader got %d of %d bytes, exit %v", len(out), len(want), exit)
	}
	l.detach(c)
	l.discard()
	if out, _, exit := drain(t, l, l.attach()); len(out) != 0 || exit.GetExitCode() != 3 {
		t.Errorf("a reader after the discard got %d bytes, exit %v", len(out), exit)
	}
}
