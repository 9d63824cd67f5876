package postgres_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/testutil"
)

// relay carries connections from a loopback listener of its own to the
// server at addr, until cut closes the listener and every connection, as a
// server that goes down does.
type relay struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newRelay(t *testing.T, addr string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln}
	t.Cleanup(r.cut)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return r
}

func (r *relay) cut() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

// TestUnreachableServer: reads and writes of a store whose server went
// away are store.ErrUnavailable (which the API answers unavailable), not
// an error the API would call internal.
func TestUnreachableServer(t *testing.T) {
	u, err := url.Parse(testutil.PostgresDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, u.Host)
	u.Host = r.ln.Addr().String()
	s := testutil.OpenPostgres(t, u.String())
	ctx := context.Background()
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	// A caller whose deadline passed is not told the store is away
	// (context.DeadlineExceeded is a net.Error too).
	ended, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if err := s.View(ended, func(tx store.Tx) error { _, err := tx.Setting(ended, "k"); return err }); errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a read with its context ended: %v, want no store.ErrUnavailable", err)
	}
	r.cut()
	for name, call := range map[string]func() error{
		"update": func() error {
			return s.Update(ctx, func(tx store.Tx) error { return tx.PutSetting(ctx, "k", []byte("w")) })
		},
		"view": func() error {
			return s.View(ctx, func(tx store.Tx) error { _, err := tx.Setting(ctx, "k"); return err })
		},
	} {
		if err := call(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s on a server gone: %v, want store.ErrUnavailable", name, err)
		}
	}
}
