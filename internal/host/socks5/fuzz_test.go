package socks5

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
)

// FuzzHandshake feeds the client whatever an endpoint answers, from the
// method selection on, for CONNECT and UDP ASSOCIATE, with and without
// credentials: the client either completes with a usable address or fails
// with an *Error.
func FuzzHandshake(f *testing.F) {
	ok4 := []byte{5, 0, 5, 0, 0, 1, 192, 0, 2, 1, 0, 80}
	f.Add(ok4, false, false)
	f.Add([]byte{5, 2, 1, 0, 5, 0, 0, 3, 4, 'h', 'o', 's', 't', 0, 53}, true, true)
	f.Add([]byte{5, 0, 5, 0, 0, 4, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 187}, false, true)
	f.Add([]byte{5, 0, 5, 5}, false, false)
	f.Add([]byte{5, 0xff}, true, false)
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"), false, false)
	f.Fuzz(func(t *testing.T, answer []byte, credentials, udp bool) {
		d := &Dialer{Endpoint: Endpoint{Address: "proxy.test:1080"}}
		if credentials {
			d.Endpoint.Username, d.Endpoint.Password = "user", "secret"
		}
		cmd := byte(cmdConnect)
		if udp {
			cmd = cmdUDPAssociate
		}
		client, endpoint := net.Pipe()
		go func() {
			// The client reads what it needs and then closes its side,
			// which ends this write.
			endpoint.Write(answer)
			endpoint.Close()
		}()
		go io.Copy(io.Discard, endpoint)
		_, bound, err := d.handshake(client, "proxy.test", cmd, addr{ip: netip.MustParseAddr("192.0.2.7"), port: 443})
		client.Close()
		if err != nil {
			if _, ok := errors.AsType[*Error](err); !ok {
				t.Fatalf("handshake failed with %T %v, want an *Error", err, err)
			}
			return
		}
		if !bound.ip.IsValid() && bound.host == "" {
			t.Fatalf("handshake succeeded with no address: %+v", bound)
		}
	})
}

// FuzzParseDatagram feeds the client what a UDP relay may send: a datagram
// it accepts is a source address and the payload after it, and re-encodes
// to the same bytes.
func FuzzParseDatagram(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 192, 0, 2, 1, 0, 53, 'h', 'i'})
	f.Add([]byte{0, 0, 0, 3, 4, 'h', 'o', 's', 't', 0, 53})
	f.Add([]byte{0, 0, 0, 4, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 53, 'x'})
	f.Add([]byte{0, 0, 1, 1, 192, 0, 2, 1, 0, 53})
	f.Fuzz(func(t *testing.T, b []byte) {
		from, payload, ok := parseDatagram(b)
		if !ok {
			return
		}
		if !from.ip.IsValid() && from.host == "" {
			t.Fatalf("accepted % x with no source address", b)
		}
		if again := append(from.appendTo([]byte{0}), payload...); !bytes.Equal(again, b[2:]) {
			t.Fatalf("accepted % x as %v and % x, which encode as % x", b, from, payload, again)
		}
	})
}
