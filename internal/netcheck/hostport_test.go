package netcheck

import (
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testutil/dnsname"
)

func TestParseHostPort(t *testing.T) {
	valid := []struct {
		in   string
		host string
		port uint16
	}{
		{"example.com:1080", "example.com", 1080},
		{"Proxy-1.Example.COM:1", "Proxy-1.Example.COM", 1},
		{"localhost:65535", "localhost", 65535},
		{"a:80", "a", 80},
		{"1a.example:80", "1a.example", 80},
		{"example.123a:80", "example.123a", 80},
		{"xn--bcher-kva.example:443", "xn--bcher-kva.example", 443},
		{"93.184.215.14:80", "93.184.215.14", 80},
		{"10.0.0.1:80", "10.0.0.1", 80}, // syntax only: not range-checked
		{"[2001:db8::1]:53", "2001:db8::1", 53},
		{"[2001:DB8:0::1]:53", "2001:DB8:0::1", 53},
		{"[::ffff:1.2.3.4]:53", "::ffff:1.2.3.4", 53},
		{strings.Repeat("a", 63) + ".example:80", strings.Repeat("a", 63) + ".example", 80},
		{dnsname.Long(253) + ":80", dnsname.Long(253), 80},
	}
	for _, tt := range valid {
		host, port, err := ParseHostPort(tt.in)
		if err != nil || host != tt.host || port != tt.port {
			t.Errorf("ParseHostPort(%q) = %q, %d, %v; want %q, %d", tt.in, host, port, err, tt.host, tt.port)
		}
	}

	invalid := []string{
		"",
		"example.com",
		"example.com:",
		":80",
		"example.com:0",
		"example.com:65536",
		"example.com:080",
		"example.com:+80",
		"example.com:-1",
		"example.com: 80",
		"example.com:8_0",
		"example.com:0x50",
		"example.com:http",
		"2001:db8::1:80",
		"[2001:db8::1]",
		"[fe80::1%eth0]:80",
		"[fe80::1%25eth0]:80",
		"[1.2.3.4]:80",
		"[example.com]:80",
		"example.com.:80",
		".example.com:80",
		"exa..mple.com:80",
		"-example.com:80",
		"example-.com:80",
		"exa_mple.com:80",
		"exa mple.com:80",
		"bücher.example:80",
		"*.example.com:80",
		"example.com/x:80",
		"1.2.3.010:80",
		"010.0.0.1:80",
		"1.2.3:80",
		"2130706433:80",
		"0x7f000001:80",
		"0x7f.1:80",
		"example.0x1F:80",
		strings.Repeat("a", 64) + ".example:80",
		dnsname.Long(254) + ":80",
		"user@example.com:80",
	}
	for _, in := range invalid {
		if host, port, err := ParseHostPort(in); err == nil {
			t.Errorf("ParseHostPort(%q) = %q, %d; want an error", in, host, port)
		}
	}
}
