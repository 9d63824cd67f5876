package sdk

import (
	"context"
	"net"

	"github.com/kibotos/kibotos/sdk/serviceconn"
)

// DialPort connects to a TCP port inside the Workspace, as seen from the
// guest: a service listening on the guest's loopback is reached too. The
// bytes go through the Workspace's data plane (ServiceService), so no
// port of the guest needs to be reachable from here. ctx bounds only the
// connecting; the connection lives until closed.
//
// The net.Conn has deadlines, and a CloseWrite method (reach it with
// conn.(interface{ CloseWrite() error })) that shuts the connection down
// for writing, as TCPConn.CloseWrite does, while reading goes on. Read
// returns io.EOF once the guest's service shut its side down. It suits
// http.Transport's DialContext:
//
//	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
//		return ws.DialPort(ctx, 8080)
//	}}
//
// Nothing listening on the port is a *connect.Error of CodeUnavailable
// whose ErrorDetail has stage CONNECTING_SERVICE; a port of 0 or above
// 65535 CodeInvalidArgument. Errors after connecting (the service reset
// the connection) have stage USING_SERVICE.
func (w *Workspace) DialPort(ctx context.Context, port uint32) (net.Conn, error) {
	for retried := false; ; retried = true {
		d, err := w.dataPlane(ctx)
		if err != nil {
			return nil, err
		}
		conn, err := serviceconn.Dial(ctx, d.services, serviceconn.Addr{Workspace: w.id, Port: port})
		if err == nil {
			return conn, nil
		}
		if !w.dropRefused(d, err) || retried {
			return nil, err
		}
	}
}
