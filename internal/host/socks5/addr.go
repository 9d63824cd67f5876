package socks5

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
)

// Address types of RFC 1928 section 5.
const (
	atypIPv4   = 0x01
	atypDomain = 0x03
	atypIPv6   = 0x04
)

// addr is a SOCKS address: an IP address, or a hostname the endpoint
// resolves.
type addr struct {
	ip   netip.Addr // valid for an IP address
	host string     // the hostname when ip is not valid
	port uint16
}

// parseAddr parses host:port. An IP literal keeps its form (an IPv4-mapped
// IPv6 address stays IPv6); anything else is a hostname of 1 to 255 bytes.
func parseAddr(s string) (addr, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return addr{}, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return addr{}, fmt.Errorf("address %q: invalid port", s)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return addr{}, fmt.Errorf("address %q: an IPv6 zone cannot be sent", s)
		}
		return addr{ip: ip, port: uint16(port)}, nil
	}
	if host == "" || len(host) > 255 {
		return addr{}, fmt.Errorf("address %q: a hostname must be 1 to 255 bytes", s)
	}
	return addr{host: host, port: uint16(port)}, nil
}

func (a addr) String() string {
	h := a.host
	if a.ip.IsValid() {
		h = a.ip.String()
	}
	return net.JoinHostPort(h, strconv.Itoa(int(a.port)))
}

// appendTo appends ATYP, ADDR and PORT.
func (a addr) appendTo(b []byte) []byte {
	switch {
	case a.ip.Is4():
		ip := a.ip.As4()
		b = append(append(b, atypIPv4), ip[:]...)
	case a.ip.IsValid():
		ip := a.ip.As16()
		b = append(append(b, atypIPv6), ip[:]...)
	default:
		b = append(append(b, atypDomain, byte(len(a.host))), a.host...)
	}
	return binary.BigEndian.AppendUint16(b, a.port)
}

// readAddr reads ATYP, ADDR and PORT. An IP address is read with its port
// in one read: on a connection each read is a system call.
func readAddr(r io.Reader) (addr, error) {
	var atyp [1]byte
	if _, err := io.ReadFull(r, atyp[:]); err != nil {
		return addr{}, err
	}
	var a addr
	var b [16 + 2]byte
	switch atyp[0] {
	case atypIPv4:
		if _, err := io.ReadFull(r, b[:4+2]); err != nil {
			return addr{}, err
		}
		a.ip = netip.AddrFrom4([4]byte(b[:4]))
		a.port = binary.BigEndian.Uint16(b[4:])
	case atypIPv6:
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return addr{}, err
		}
		a.ip = netip.AddrFrom16([16]byte(b[:16]))
		a.port = binary.BigEndian.Uint16(b[16:])
	case atypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return addr{}, err
		}
		if n[0] == 0 {
			return addr{}, errors.New("empty hostname")
		}
		h := make([]byte, int(n[0])+2)
		if _, err := io.ReadFull(r, h); err != nil {
			return addr{}, err
		}
		a.host = string(h[:n[0]])
		a.port = binary.BigEndian.Uint16(h[n[0]:])
	default:
		return addr{}, fmt.Errorf("unknown address type 0x%02x", atyp[0])
	}
	return a, nil
}

// parseDatagram splits a datagram from a UDP relay into its source address
// and payload (RFC 1928 section 7). It refuses fragments, which this client
// never requests and so must drop.
func parseDatagram(b []byte) (from addr, payload []byte, ok bool) {
	if len(b) < 4 || b[2] != 0 {
		return addr{}, nil, false
	}
	r := bytes.NewReader(b[3:])
	from, err := readAddr(r)
	if err != nil {
		return addr{}, nil, false
	}
	return from, b[len(b)-r.Len():], true
}
