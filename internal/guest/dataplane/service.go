package dataplane

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

// The stages of ServiceService's errors.
const (
	stageConnectingService = ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE
	stageUsingService      = ctrlv1.FailureStage_FAILURE_STAGE_USING_SERVICE
)

const (
	// serviceChunk bounds the bytes of one response message, and so what
	// the agent holds of one connection's output.
	serviceChunk = 64 << 10
	// serviceDialTimeout bounds one attempt to connect to a guest port.
	serviceDialTimeout = 10 * time.Second
)

// ServiceService is the data plane's ServiceService: byte streams to TCP
// ports inside the guest, dialed from the agent's own network namespace,
// which is the guest's.
type ServiceService struct {
	datav1connect.UnimplementedServiceServiceHandler
}

// NewServiceService returns a ServiceService.
func NewServiceService() *ServiceService { return &ServiceService{} }

// ConnectService connects to the port the first message names and copies
// bytes both ways until both directions have ended; see the proto.
func (s *ServiceService) ConnectService(ctx context.Context, stream *connect.BidiStream[datav1.ConnectServiceRequest, datav1.ConnectServiceResponse]) error {
	first, err := stream.Receive()
	if errors.Is(err, io.EOF) {
		return newError(connect.CodeInvalidArgument, stageConnectingService, "the first message must name a port")
	}
	if err != nil {
		return err
	}
	port := first.GetPort()
	if port == 0 || port > 65535 {
		return newError(connect.CodeInvalidArgument, stageConnectingService, "port %d: want a TCP port from 1 to 65535", port)
	}
	conn, err := dialGuestPort(ctx, uint16(port))
	if err != nil {
		if ctx.Err() != nil {
			return toConnect(stageConnectingService, ctx.Err())
		}
		return newError(connect.CodeUnavailable, stageConnectingService, "nothing in the workspace accepts connections on port %d: %v", port, err)
	}
	defer conn.Close()
	if err := stream.Send(&datav1.ConnectServiceResponse{Connected: true}); err != nil {
		return err
	}

	// The request half runs beside; the response half here, so that no
	// Send outlives the handler. A failed request half records its error
	// before closing the connection, so the response half that the close
	// ends returns that error, not its own.
	requestsDone := make(chan error, 1)
	go func() {
		err := copyRequests(stream, first.GetData(), conn)
		requestsDone <- err
		if err != nil {
			conn.Close()
		}
	}()
	if err := copyResponses(stream, conn); err != nil {
		select {
		case reqErr := <-requestsDone:
			if reqErr != nil {
				return reqErr
			}
		default:
			// The request half may be blocked in Receive: returning ends
			// the call, which closes the request body and so unblocks it.
		}
		return err
	}
	return <-requestsDone
}

// copyRequests writes the data of the request stream to conn, starting
// with first's, and shuts conn down for writing at the stream's end.
func copyRequests(stream *connect.BidiStream[datav1.ConnectServiceRequest, datav1.ConnectServiceResponse], first []byte, conn *net.TCPConn) error {
	data := first
	for {
		if len(data) > 0 {
			if _, err := conn.Write(data); err != nil {
				return newError(connect.CodeUnavailable, stageUsingService, "writing to the service: %v", err)
			}
		}
		msg, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			if err := conn.CloseWrite(); err != nil {
				return newError(connect.CodeUnavailable, stageUsingService, "shutting the connection down for writing: %v", err)
			}
			return nil
		}
		if err != nil {
			return err
		}
		if msg.GetPort() != 0 {
			return newError(connect.CodeInvalidArgument, stageUsingService, "only the first message names a port")
		}
		data = msg.GetData()
	}
}

// copyResponses sends what conn reads, then a response with eof at its
// end.
func copyResponses(stream *connect.BidiStream[datav1.ConnectServiceRequest, datav1.ConnectServiceResponse], conn *net.TCPConn) error {
	buf := make([]byte, serviceChunk)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if err := stream.Send(&datav1.ConnectServiceResponse{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return stream.Send(&datav1.ConnectServiceResponse{Eof: true})
		}
		if err != nil {
			return newError(connect.CodeUnavailable, stageUsingService, "reading from the service: %v", err)
		}
	}
}

// dialGuestPort connects to port on the guest's loopback (IPv4, then
// IPv6), then on each address of its other interfaces, and returns the
// first connection, or the first error when none accepts.
func dialGuestPort(ctx context.Context, port uint16) (*net.TCPConn, error) {
	var firstErr error
	for _, addr := range guestAddrs() {
		d := net.Dialer{Timeout: serviceDialTimeout}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, port).String())
		if err == nil {
			return c.(*net.TCPConn), nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// guestAddrs lists the addresses a service may listen on: the loopback
// ones first, then the global and private unicast addresses of the
// guest's interfaces (link-local ones would need a zone).
func guestAddrs() []netip.Addr {
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	ifAddrs, _ := net.InterfaceAddrs()
	for _, a := range ifAddrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		if ip := p.Addr().Unmap(); ip.IsGlobalUnicast() {
			addrs = append(addrs, ip)
		}
	}
	return addrs
}
