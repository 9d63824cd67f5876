package netcheck

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// ParseHostPort splits an endpoint written as host:port. The port is decimal
// from 1 to 65535 with no sign or leading zero. The host is an IP address
// without zone, IPv6 in brackets, or a DNS hostname under RFC 1123: at most
// 253 characters, dot-separated labels of 1 to 63 letters, digits and
// hyphens that neither start nor end with a hyphen, no trailing dot, and a
// last label that does not look numeric (so "1.2.3.010" or "0x7f000001" is
// never handed to a resolver that might read it as an IPv4 address). The
// host is returned without brackets and is not range-checked.
func ParseHostPort(s string) (host string, port uint16, err error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("invalid endpoint %q: %v", s, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || p[0] == '0' {
		return "", 0, fmt.Errorf("invalid endpoint %q: port must be a decimal number from 1 to 65535", s)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		switch {
		case addr.Zone() != "":
			return "", 0, fmt.Errorf("invalid endpoint %q: an IP address must not have a zone", s)
		case addr.Is4() && strings.HasPrefix(s, "["):
			return "", 0, fmt.Errorf("invalid endpoint %q: only an IPv6 address goes in brackets", s)
		}
		return host, uint16(n), nil
	}
	if strings.HasPrefix(s, "[") {
		return "", 0, fmt.Errorf("invalid endpoint %q: only an IPv6 address goes in brackets", s)
	}
	if err := checkHostname(host); err != nil {
		return "", 0, fmt.Errorf("invalid endpoint %q: %w", s, err)
	}
	return host, uint16(n), nil
}

func checkHostname(h string) error {
	if h == "" {
		return fmt.Errorf("host is empty")
	}
	if len(h) > 253 {
		return fmt.Errorf("hostname is longer than 253 characters")
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("hostname %q has a label that is empty or longer than 63 characters", h)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("hostname %q has a label that starts or ends with a hyphen", h)
		}
		for i := range len(l) {
			if !isLetterDigit(l[i]) && l[i] != '-' {
				return fmt.Errorf("hostname %q may contain only letters, digits, hyphens and dots", h)
			}
		}
	}
	if looksNumeric(labels[len(labels)-1]) {
		return fmt.Errorf("host %q is neither a valid IP address nor a hostname", h)
	}
	return nil
}

// looksNumeric reports whether a label is decimal digits or 0x followed by
// hex digits: the forms inet_aton reads as part of an IPv4 address.
func looksNumeric(label string) bool {
	digits := "0123456789"
	if len(label) >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X') {
		label, digits = label[2:], "0123456789abcdefABCDEF"
	}
	return strings.Trim(label, digits) == ""
}

func isLetterDigit(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

// ValidateHost checks a bare host (such as a TLS server name) by the rules
// of ParseHostPort: an IP address without zone, or an RFC 1123 hostname.
func ValidateHost(h string) error {
	if addr, err := netip.ParseAddr(h); err == nil {
		if addr.Zone() != "" {
			return fmt.Errorf("host %q: an IP address must not have a zone", h)
		}
		return nil
	}
	return checkHostname(h)
}
