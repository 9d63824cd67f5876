package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk"
)

const (
	// forwardDialTimeout bounds connecting one forwarded connection to the
	// guest port.
	forwardDialTimeout = 30 * time.Second
	// forwardBuffer is the size of each direction's copy buffer, and so of
	// the data-plane messages a forwarded connection sends.
	forwardBuffer = 64 << 10
)

// portPair is a local port forwarded to a guest port; local 0 picks one.
type portPair struct {
	local, remote uint16
}

// parsePortPairs parses LOCAL:REMOTE, :REMOTE (pick a local port) and PORT
// (the same on both ends).
func parsePortPairs(args []string) ([]portPair, error) {
	var pairs []portPair
	for _, a := range args {
		localText, remoteText, hasLocal := strings.Cut(a, ":")
		if !hasLocal {
			remoteText = localText
		}
		remote, err := strconv.ParseUint(remoteText, 10, 16)
		if err != nil || remote == 0 {
			return nil, fmt.Errorf("%q: want LOCAL:REMOTE, :REMOTE or PORT, with a remote port from 1 to 65535", a)
		}
		var local uint64
		if localText != "" {
			if local, err = strconv.ParseUint(localText, 10, 16); err != nil {
				return nil, fmt.Errorf("%q: the local port must be from 0 (pick one) to 65535", a)
			}
		}
		pairs = append(pairs, portPair{local: uint16(local), remote: uint16(remote)})
	}
	return pairs, nil
}

func wsPortForwardCommand(c *conn) *cobra.Command {
	var addresses []string
	cmd := &cobra.Command{
		Use:   "port-forward [--address ADDR,...] ID [LOCAL:]REMOTE...",
		Short: "Forward local ports to TCP ports inside a Workspace until interrupted",
		Long: "Listen on each LOCAL port and forward every connection to the REMOTE port inside the\n" +
			"Workspace, as seen from the guest: a service on the guest's loopback is reached too. The\n" +
			"bytes go through the Workspace's data plane, one ConnectService stream per connection;\n" +
			"half-closes pass both ways. LOCAL 0 or an empty LOCAL (:REMOTE) picks a free port, PORT\n" +
			"alone forwards the same port number; the ports listened on are printed. A connection that\n" +
			"fails is reported and reset, the others go on; one that finds the Workspace deleted, or is\n" +
			"open while it is deleted, ends the command with that error. Ctrl-C ends everything.",
		Example: "  kibotos ws port-forward ws_0123 8080:80 :5432\n" +
			"  kibotos ws port-forward --address 127.0.0.1,::1 ws_0123 3000",
		Args: cobra.MinimumNArgs(2),
	}
	cmd.Flags().StringSliceVar(&addresses, "address", []string{"127.0.0.1"}, "local addresses to listen on, comma-separated")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		pairs, err := parsePortPairs(args[1:])
		if err != nil {
			return err
		}
		if err := checkListenAddresses(addresses); err != nil {
			return err
		}
		ws, closeIdle, err := openWorkspace(cmd, c, args[0])
		if err != nil {
			return err
		}
		defer closeIdle()
		// A token that may not reach the data plane (a viewer's) is told
		// so before anything listens, not at every connection.
		if _, err := ws.Session(cmd.Context()); err != nil {
			return err
		}
		var listeners []net.Listener
		defer func() {
			for _, ln := range listeners {
				ln.Close()
			}
		}()
		type forward struct {
			ln     net.Listener
			remote uint16
		}
		var forwards []forward
		for _, addr := range addresses {
			for _, p := range pairs {
				ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(int(p.local))))
				if err != nil {
					return err
				}
				listeners = append(listeners, ln)
				forwards = append(forwards, forward{ln, p.remote})
				fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s -> %d\n", ln.Addr(), p.remote)
			}
		}
		// A connection that finds the workspace deleted ends everything
		// with that error: no later connection could reach it.
		ctx, gone := context.WithCancelCause(cmd.Context())
		defer gone(nil)
		stop := context.AfterFunc(ctx, func() {
			for _, ln := range listeners {
				ln.Close()
			}
		})
		defer stop()
		var wg sync.WaitGroup
		errOut := &lockedWriter{w: cmd.ErrOrStderr()}
		for _, f := range forwards {
			wg.Go(func() { acceptForwards(ctx, f.ln, ws, f.remote, errOut, gone) })
		}
		wg.Wait()
		if err := context.Cause(ctx); cmd.Context().Err() == nil && err != nil {
			return err
		}
		return cmd.Context().Err() // interrupted: Main says so, and exits 128 plus the signal
	}
	return cmd
}

// checkListenAddresses refuses an empty --address list or entry: Listen
// takes an empty host for every interface, which nobody asked for.
func checkListenAddresses(addresses []string) error {
	if len(addresses) == 0 {
		return errors.New("--address: name at least one local address, such as 127.0.0.1")
	}
	for _, a := range addresses {
		if strings.TrimSpace(a) == "" {
			return fmt.Errorf("--address %q: an empty address would listen on every interface; name it (0.0.0.0 or :: for all of them)", strings.Join(addresses, ","))
		}
	}
	return nil
}

// workspaceGone reports whether err says the workspace was deleted.
func workspaceGone(err error) bool {
	f, _ := sdk.FailureOf(err)
	return f.GetObservedWorkspace().GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED
}

// deletedUnder returns the error that ends the command when a connection
// failed with err because the workspace was deleted under it, or nil. The
// data plane cannot say so (it tells a caller nothing of a workspace
// whose session it no longer admits: unauthenticated, or unavailable once
// the guest went away), so the control plane is asked.
func deletedUnder(ctx context.Context, ws *sdk.Workspace, err error) error {
	if workspaceGone(err) {
		return err
	}
	if code := connect.CodeOf(err); code != connect.CodeUnauthenticated && code != connect.CodeUnavailable {
		return nil
	}
	info, rerr := ws.Refresh(ctx)
	switch state := info.GetState(); {
	case rerr != nil && (workspaceGone(rerr) || connect.CodeOf(rerr) == connect.CodeNotFound):
		return rerr
	case rerr == nil && (state == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETING || state == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("workspace %s is %s: its forwarded connections ended (%w)",
			ws.ID(), strings.TrimPrefix(state.String(), "WORKSPACE_STATE_"), err))
	}
	return nil
}

// acceptForwards forwards each connection ln accepts to the guest port
// until ln is closed, and waits for the connections to end.
func acceptForwards(ctx context.Context, ln net.Listener, ws *sdk.Workspace, remote uint16, errOut io.Writer, gone context.CancelCauseFunc) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		local, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				fmt.Fprintf(errOut, "port-forward: %s: %v\n", ln.Addr(), err)
			}
			return
		}
		wg.Go(func() {
			err := forwardConn(ctx, local, ws, remote)
			if err == nil || ctx.Err() != nil {
				return
			}
			if deleted := deletedUnder(ctx, ws, err); deleted != nil {
				gone(deleted)
				return
			}
			fmt.Fprintf(errOut, "port-forward: connection from %s to port %d: %v\n", local.RemoteAddr(), remote, err)
		})
	}
}

// forwardConn connects local to the guest port and copies both ways, each
// direction's end passed on as a half-close, until both have ended, one
// fails, or ctx ends. It closes both connections: local with a reset when
// a direction failed (resetConn).
func forwardConn(ctx context.Context, local net.Conn, ws *sdk.Workspace, port uint16) error {
	defer local.Close()
	dialCtx, cancel := context.WithTimeout(ctx, forwardDialTimeout)
	remote, err := ws.DialPort(dialCtx, uint32(port))
	cancel()
	if err != nil {
		resetConn(local)
		return err
	}
	defer remote.Close()
	closeBoth := func() {
		local.Close()
		remote.Close()
	}
	defer context.AfterFunc(ctx, closeBoth)()
	done := make(chan error, 2)
	go func() { done <- copyHalf(remote, local) }()
	go func() { done <- copyHalf(local, remote) }()
	var first error
	for range 2 {
		if err := <-done; err != nil && first == nil {
			first = err
			resetConn(local)
			closeBoth() // ends the other direction
		}
	}
	return first
}

// resetConn makes c's Close reset the connection rather than end it with
// a FIN, which a local client would read as the whole of what the guest
// sent: a protocol without lengths could not tell a stream cut short (the
// guest's service reset it, the session was revoked, the guest went away)
// from a whole one.
func resetConn(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
}

// copyHalf copies src to dst until src's EOF, then shuts dst down for
// writing.
func copyHalf(dst, src net.Conn) error {
	// Plain Reader and Writer: no ReadFrom or WriteTo with a buffer of
	// their own, so that each message carries up to forwardBuffer bytes.
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, forwardBuffer))
	if err != nil {
		return err
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// lockedWriter serializes the writes of concurrent connections.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
