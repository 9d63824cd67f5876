package imagestore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestBuiltinNetworkTools: in the built-in image's root, wget (with a
// timeout, which crashes busybox's), nc and nslookup reach a test server on
// loopback.
func TestBuiltinNetworkTools(t *testing.T) {
	if _, err := os.Stat(DefaultBusybox); err != nil {
		t.Skipf("no busybox: %v", err)
	}
	ctx := context.Background()
	s := openStore(t)
	src, err := BuiltinImage(DefaultBusybox)
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.ImportImage(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.Unpack(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	root := dirs[0]
	run := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command("chroot", append([]string{root}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}

	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello from the test host") }))
	defer web.Close()
	if out := run("", "wget", "-q", "-T", "10", "-O", "-", web.URL); out != "hello from the test host" {
		t.Errorf("wget printed %q", out)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	run("ping over nc\n", "nc", "127.0.0.1", fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	if b := <-got; b != "ping over nc\n" {
		t.Errorf("nc delivered %q", b)
	}

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IPv4(192, 0, 2, 7)})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	defer srv.Shutdown()
	port := pc.LocalAddr().(*net.UDPAddr).Port
	if out := run("", "nslookup", "-type=a", "-port="+fmt.Sprint(port), "kibotos.test", "127.0.0.1"); !strings.Contains(out, "192.0.2.7") {
		t.Errorf("nslookup printed %q", out)
	}
}
