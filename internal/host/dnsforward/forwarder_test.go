package dnsforward

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

var direct = (&net.Dialer{}).DialContext

// reports records what a Forwarder reports.
type reports struct {
	mu   sync.Mutex
	errs []error
}

func (r *reports) report(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *reports) get() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// newForwarder returns a Forwarder for up that records its reports.
func newForwarder(up Upstream, dial DialFunc) (*Forwarder, *reports) {
	r := &reports{}
	return &Forwarder{Upstream: up, Dial: dial, Timeout: 2 * time.Second, Report: r.report}, r
}

func query(t *testing.T, name string) (*dns.Msg, []byte) {
	t.Helper()
	q := new(dns.Msg).SetQuestion(name, dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return q, b
}

// unpackReply parses reply and checks that it answers q with rcode.
func unpackReply(t *testing.T, q *dns.Msg, reply []byte, rcode int) *dns.Msg {
	t.Helper()
	var r dns.Msg
	if err := r.Unpack(reply); err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	if !r.Response || r.Id != q.Id {
		t.Fatalf("reply is not a response to query %d: %v", q.Id, &r)
	}
	if len(r.Question) != 1 || r.Question[0] != q.Question[0] {
		t.Fatalf("reply question = %v, want %v", r.Question, q.Question[0])
	}
	if r.Rcode != rcode {
		t.Fatalf("rcode = %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[rcode])
	}
	return &r
}

// answerEach queries example.test. through each upstream, in a subtest of
// its name, and wants the rcode and the one report.
func answerEach(t *testing.T, ups map[string]Upstream, rcode int, report any) {
	for name, up := range ups {
		t.Run(name, func(t *testing.T) {
			f, r := newForwarder(up, direct)
			q, b := query(t, "example.test.")
			unpackReply(t, q, f.Answer(t.Context(), b), rcode)
			wantReports(t, r, report)
		})
	}
}

// wantReports checks the reports: nil for a success, a Kind for a *Error.
func wantReports(t *testing.T, r *reports, want ...any) {
	t.Helper()
	got := r.get()
	if len(got) != len(want) {
		t.Fatalf("reports = %v, want %d", got, len(want))
	}
	for i, w := range want {
		if w == nil {
			if got[i] != nil {
				t.Errorf("report %d = %v, want nil", i, got[i])
			}
			continue
		}
		e, ok := got[i].(*Error)
		if !ok || e.Kind != w.(Kind) {
			t.Errorf("report %d = %#v, want a *Error of kind %v", i, got[i], w)
		}
	}
}

// upstreams starts one upstream per protocol that answers from the zone.
func upstreams(t *testing.T, serverTLS *tls.Config, caPEM string) map[string]Upstream {
	return map[string]Upstream{
		"udp":   {Protocol: UDP, Address: udpUpstream(t)},
		"tcp":   {Protocol: TCP, Address: tcpUpstream(t, nil)},
		"tls":   {Protocol: TLS, Address: tcpUpstream(t, serverTLS), CACertPEM: caPEM},
		"https": {Protocol: HTTPS, URL: httpsUpstream(t, serverTLS) + "/dns-query", CACertPEM: caPEM},
	}
}

func TestAnswerForwardsAndPassesResultsThrough(t *testing.T) {
	serverTLS, caPEM := testtls.New(t, "127.0.0.1", "dns.test")
	for name, up := range upstreams(t, serverTLS, caPEM) {
		t.Run(name, func(t *testing.T) {
			f, r := newForwarder(up, direct)

			q, b := query(t, "example.test.")
			reply := unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeSuccess)
			if len(reply.Answer) != 1 || reply.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
				t.Errorf("answer = %v, want example.test. A 192.0.2.1", reply.Answer)
			}

			// NXDOMAIN and SERVFAIL are what the upstream answered, not faults.
			q, b = query(t, "missing.test.")
			unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeNameError)
			q, b = query(t, "broken.test.")
			unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)

			wantReports(t, r, nil, nil, nil)
		})
	}
}

// TestAnswerOfATruncatedUDPAnswer: an answer a UDP upstream truncates is
// asked again over TCP, as a stub resolver does, and given whole (the
// guest that retries over TCP gets it; one asking over UDP gets it cut
// to fit, FitUDP); an upstream that serves no TCP, or truncates there
// too, leaves the truncated answer, TC bit and all.
func TestAnswerOfATruncatedUDPAnswer(t *testing.T) {
	for name, c := range map[string]struct {
		address, name string
		answers       int
	}{
		"whole over TCP": {dualUpstream(t), "big.test.", 60},
		"no TCP":         {udpUpstream(t), "big.test.", 0},
		"truncated both": {dualUpstream(t), "truncated.test.", 0},
	} {
		f, r := newForwarder(Upstream{Protocol: UDP, Address: c.address}, direct)
		q, b := query(t, c.name)
		reply := unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeSuccess)
		if reply.Truncated != (c.answers == 0) || len(reply.Answer) != c.answers {
			t.Errorf("%s: truncated %v with %d answers, want %d", name, reply.Truncated, len(reply.Answer), c.answers)
		}
		wantReports(t, r, nil)
	}
}

func TestAnswerTLSServerName(t *testing.T) {
	serverTLS, caPEM := testtls.New(t, "127.0.0.1", "dns.test")
	address := tcpUpstream(t, serverTLS)
	url := httpsUpstream(t, serverTLS) + "/dns-query"
	answerEach(t, map[string]Upstream{
		"tls":   {Protocol: TLS, Address: address, ServerName: "dns.test", CACertPEM: caPEM},
		"https": {Protocol: HTTPS, URL: url, ServerName: "dns.test", CACertPEM: caPEM},
	}, dns.RcodeSuccess, nil)
}

func TestAnswerTLSVerificationFailed(t *testing.T) {
	serverTLS, caPEM := testtls.New(t, "127.0.0.1", "dns.test")
	_, otherCA := testtls.New(t, "127.0.0.1", "dns.test")
	address := tcpUpstream(t, serverTLS)
	url := httpsUpstream(t, serverTLS) + "/dns-query"
	answerEach(t, map[string]Upstream{
		"tls wrong CA":     {Protocol: TLS, Address: address, CACertPEM: otherCA},
		"tls wrong name":   {Protocol: TLS, Address: address, ServerName: "other.test", CACertPEM: caPEM},
		"tls system roots": {Protocol: TLS, Address: address},
		"tls CA not PEM":   {Protocol: TLS, Address: address, CACertPEM: "not a certificate"},
		"https wrong CA":   {Protocol: HTTPS, URL: url, CACertPEM: otherCA},
		"https wrong name": {Protocol: HTTPS, URL: url, ServerName: "other.test", CACertPEM: caPEM},
	}, dns.RcodeServerFailure, TLSVerificationFailed)
}

func TestAnswerHTTPErrorStatus(t *testing.T) {
	serverTLS, caPEM := testtls.New(t, "127.0.0.1")
	base := httpsUpstream(t, serverTLS)
	for _, path := range []string{"/fail", "/nothing-here"} {
		f, r := newForwarder(Upstream{Protocol: HTTPS, URL: base + path, CACertPEM: caPEM}, direct)
		q, b := query(t, "example.test.")
		unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
		wantReports(t, r, HTTPErrorStatus)
		if e := r.get()[0].(*Error); !strings.Contains(e.Error(), "404") && !strings.Contains(e.Error(), "500") {
			t.Errorf("error %q does not name the status", e)
		}
	}
}

func TestAnswerUpstreamUnreachable(t *testing.T) {
	for name, up := range map[string]Upstream{
		"udp":   {Protocol: UDP, Address: closedPort(t, "udp")},
		"tcp":   {Protocol: TCP, Address: closedPort(t, "tcp")},
		"tls":   {Protocol: TLS, Address: closedPort(t, "tcp")},
		"https": {Protocol: HTTPS, URL: "https://" + closedPort(t, "tcp") + "/dns-query"},
	} {
		t.Run(name, func(t *testing.T) {
			f, r := newForwarder(up, direct)
			q, b := query(t, "example.test.")
			start := time.Now()
			unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
			if elapsed := time.Since(start); elapsed >= f.Timeout {
				t.Errorf("a refused upstream took %v, the whole deadline", elapsed)
			}
			wantReports(t, r, UpstreamUnreachable)
		})
	}
}

func TestAnswerUpstreamTimeout(t *testing.T) {
	_, caPEM := testtls.New(t, "127.0.0.1")
	silentUDP, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silentUDP.Close()
	// A listener that never accepts still completes TCP handshakes, so the
	// query is written and never answered; TLS stalls in its handshake.
	silentTCP := listenTCP(t).Addr().String()
	for name, up := range map[string]Upstream{
		"udp":   {Protocol: UDP, Address: silentUDP.LocalAddr().String()},
		"tcp":   {Protocol: TCP, Address: silentTCP},
		"tls":   {Protocol: TLS, Address: silentTCP, CACertPEM: caPEM},
		"https": {Protocol: HTTPS, URL: "https://" + silentTCP + "/dns-query", CACertPEM: caPEM},
	} {
		t.Run(name, func(t *testing.T) {
			f, r := newForwarder(up, direct)
			f.Timeout = 300 * time.Millisecond
			q, b := query(t, "example.test.")
			start := time.Now()
			unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
			if elapsed := time.Since(start); elapsed < f.Timeout || elapsed > f.Timeout+time.Second {
				t.Errorf("answered after %v, want the %v deadline", elapsed, f.Timeout)
			}
			wantReports(t, r, UpstreamTimeout)
		})
	}

	// The UDP query was sent twice: once, and again when no answer came.
	buf := make([]byte, dns.MaxMsgSize)
	for i := range 2 {
		silentUDP.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := silentUDP.ReadFrom(buf); err != nil {
			t.Fatalf("datagram %d: %v", i+1, err)
		}
	}
	silentUDP.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, _, err := silentUDP.ReadFrom(buf); err == nil {
		t.Error("the UDP query was sent more than twice")
	}
}

func TestAnswerDefaultTimeout(t *testing.T) {
	f := &Forwarder{Upstream: Upstream{Protocol: TCP, Address: listenTCP(t).Addr().String()}, Dial: direct}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	var reported error
	f.Report = func(err error) { reported = err }
	q, b := query(t, "example.test.")
	unpackReply(t, q, f.Answer(ctx, b), dns.RcodeServerFailure)
	// The caller's shorter deadline bounds the query too.
	if e, ok := reported.(*Error); !ok || e.Kind != UpstreamTimeout {
		t.Errorf("report = %v, want UpstreamTimeout", reported)
	}
}

// udpResponder answers UDP queries with respond's datagrams.
func udpResponder(t *testing.T, respond func(n int, q *dns.Msg) []*dns.Msg) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, dns.MaxMsgSize)
		for n := 1; ; n++ {
			size, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var q dns.Msg
			if q.Unpack(buf[:size]) != nil {
				continue
			}
			for _, m := range respond(n, &q) {
				b, _ := m.Pack()
				pc.WriteTo(b, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}

func TestAnswerUDPIgnoresOtherAnswers(t *testing.T) {
	address := udpResponder(t, func(_ int, q *dns.Msg) []*dns.Msg {
		otherID := zoneReply(q, true)
		otherID.Id++
		otherQuestion := zoneReply(q, true)
		otherQuestion.Question[0].Name = "other.test."
		notResponse := zoneReply(q, true)
		notResponse.Response = false
		return []*dns.Msg{otherID, otherQuestion, notResponse, zoneReply(q, true)}
	})
	f, r := newForwarder(Upstream{Protocol: UDP, Address: address}, direct)
	q, b := query(t, "example.test.")
	reply := unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeSuccess)
	if len(reply.Answer) != 1 {
		t.Errorf("answer = %v, want the zone's", reply.Answer)
	}
	wantReports(t, r, nil)
}

func TestAnswerUDPResendsLostQuery(t *testing.T) {
	var received atomic.Int32
	address := udpResponder(t, func(n int, q *dns.Msg) []*dns.Msg {
		received.Add(1)
		if n == 1 {
			return nil // lost
		}
		return []*dns.Msg{zoneReply(q, true)}
	})
	f, r := newForwarder(Upstream{Protocol: UDP, Address: address}, direct)
	f.Timeout = time.Second
	q, b := query(t, "example.test.")
	unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeSuccess)
	wantReports(t, r, nil)
	if n := received.Load(); n != 2 {
		t.Errorf("upstream received %d datagrams, want 2", n)
	}
}

// fault is a Dial error.
type fault struct{ egress bool }

func (f *fault) Error() string     { return "socks5 endpoint down" }
func (f *fault) EgressFault() bool { return f.egress }

func TestAnswerEgressFaultReportedUnchanged(t *testing.T) {
	for _, p := range []Protocol{UDP, TCP, TLS, HTTPS} {
		t.Run(p.String(), func(t *testing.T) {
			egress := &fault{egress: true}
			var (
				mu     sync.Mutex
				dialed []string
			)
			dial := func(_ context.Context, network, address string) (net.Conn, error) {
				mu.Lock()
				defer mu.Unlock()
				dialed = append(dialed, network+" "+address)
				return nil, egress
			}
			up := Upstream{Protocol: p, Address: "resolver.internal:853", URL: "https://resolver.internal/dns-query"}
			f, r := newForwarder(up, dial)
			q, b := query(t, "example.test.")
			unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
			if got := r.get(); len(got) != 1 || got[0] != error(egress) {
				t.Errorf("reports = %v, want the Dial error itself", got)
			}
			want := map[Protocol]string{
				UDP:   "udp resolver.internal:853",
				TCP:   "tcp resolver.internal:853",
				TLS:   "tcp resolver.internal:853",
				HTTPS: "tcp resolver.internal:443",
			}[p]
			mu.Lock()
			defer mu.Unlock()
			if len(dialed) == 0 || dialed[0] != want {
				t.Errorf("dialed %v, want %q", dialed, want)
			}
		})
	}
}

func TestAnswerDialErrorOfUpstream(t *testing.T) {
	upstreamFault := &fault{egress: false}
	f, r := newForwarder(Upstream{Protocol: TCP, Address: "192.0.2.1:53"},
		func(context.Context, string, string) (net.Conn, error) { return nil, upstreamFault })
	q, b := query(t, "example.test.")
	unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
	wantReports(t, r, UpstreamUnreachable)
	if err := r.get()[0]; !errors.Is(err, upstreamFault) {
		t.Errorf("report %v does not wrap the Dial error", err)
	}
}

func TestAnswerWithoutDialFails(t *testing.T) {
	f, r := newForwarder(Upstream{Protocol: UDP, Address: "127.0.0.1:53"}, nil)
	q, b := query(t, "example.test.")
	unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
	wantReports(t, r, UpstreamUnreachable)
}

func TestAnswerReportsSuccessAfterFailure(t *testing.T) {
	var address atomic.Value
	address.Store(closedPort(t, "tcp"))
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return direct(ctx, network, address.Load().(string))
	}
	f, r := newForwarder(Upstream{Protocol: TCP, Address: "resolver.test:53"}, dial)

	q, b := query(t, "example.test.")
	unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeServerFailure)
	address.Store(tcpUpstream(t, nil))
	unpackReply(t, q, f.Answer(t.Context(), b), dns.RcodeSuccess)
	wantReports(t, r, UpstreamUnreachable, nil)
}

func TestAnswerCanceledIsNotReported(t *testing.T) {
	f, r := newForwarder(Upstream{Protocol: TCP, Address: listenTCP(t).Addr().String()}, direct)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	q, b := query(t, "example.test.")
	start := time.Now()
	unpackReply(t, q, f.Answer(ctx, b), dns.RcodeServerFailure)
	if elapsed := time.Since(start); elapsed >= f.Timeout {
		t.Errorf("a canceled query took %v", elapsed)
	}
	wantReports(t, r)
}

func TestAnswerMalformedQuery(t *testing.T) {
	_, good := query(t, "example.test.")
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	twoQuestions := new(dns.Msg).SetQuestion("example.test.", dns.TypeA)
	twoQuestions.Question = append(twoQuestions.Question, twoQuestions.Question[0])
	response := new(dns.Msg).SetQuestion("example.test.", dns.TypeA)
	response.Response = true
	noQuestion := new(dns.Msg)
	noQuestion.Id = 7

	for _, tc := range []struct {
		name  string
		query []byte
		drop  bool
	}{
		{"empty", nil, true},
		{"shorter than a header", good[:5], true},
		{"a response", pack(response), true},
		{"cut in the question", good[:15], false},
		{"no question", pack(noQuestion), false},
		{"two questions", pack(twoQuestions), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dial := func(context.Context, string, string) (net.Conn, error) {
				t.Error("a malformed query was forwarded")
				return nil, errors.New("no")
			}
			f, r := newForwarder(Upstream{Protocol: UDP, Address: "127.0.0.1:53"}, dial)
			reply := f.Answer(t.Context(), tc.query)
			if !bytes.Equal(reply, Fail(tc.query, dns.RcodeRefused)) {
				t.Error("Answer and Fail disagree")
			}
			wantReports(t, r)
			if tc.drop {
				if reply != nil {
					t.Errorf("reply = %x, want nil (drop)", reply)
				}
				return
			}
			var m dns.Msg
			if err := m.Unpack(reply); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			var id dns.Msg
			id.Unpack(tc.query) // partial: the header is enough
			if !m.Response || m.Id != id.Id || m.Rcode != dns.RcodeFormatError {
				t.Errorf("reply = %v, want FORMERR for ID %d", &m, id.Id)
			}
		})
	}
}

func TestFail(t *testing.T) {
	q, b := query(t, "example.test.")
	for _, rcode := range []int{dns.RcodeRefused, dns.RcodeServerFailure} {
		reply := unpackReply(t, q, Fail(b, rcode), rcode)
		if !reply.RecursionAvailable || !reply.RecursionDesired {
			t.Errorf("reply flags = %v, want RD and RA", &reply.MsgHdr)
		}
		if reply.IsEdns0() != nil {
			t.Error("a query without EDNS0 got an OPT record")
		}
	}

	q.SetEdns0(4096, true)
	edns, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if reply := unpackReply(t, q, Fail(edns, dns.RcodeRefused), dns.RcodeRefused); reply.IsEdns0() == nil {
		t.Error("a query with EDNS0 got no OPT record")
	}
}

func TestFitUDP(t *testing.T) {
	f, _ := newForwarder(Upstream{Protocol: TCP, Address: tcpUpstream(t, nil)}, direct)

	q, plain := query(t, "many.test.")
	answer := f.Answer(t.Context(), plain)
	reply := fitPlainUDP(t, q, plain, answer)
	if !reply.Truncated || len(reply.Answer) == 0 || len(reply.Answer) >= 60 {
		t.Errorf("cut answer: TC=%v with %d records, want TC and some of 60", reply.Truncated, len(reply.Answer))
	}

	q.SetEdns0(4096, false)
	edns, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if got := FitUDP(edns, answer); !bytes.Equal(got, answer) {
		t.Error("an answer within the EDNS0 size was changed")
	}
	_, small := query(t, "example.test.")
	if answer := f.Answer(t.Context(), small); !bytes.Equal(FitUDP(small, answer), answer) {
		t.Error("an answer within 512 bytes was changed")
	}
}

// fitPlainUDP cuts answer, larger than 512 bytes, for plain, the packed
// query q without EDNS0, checks that the cut fits 512 bytes and answers q,
// and returns it.
func fitPlainUDP(t *testing.T, q *dns.Msg, plain, answer []byte) *dns.Msg {
	t.Helper()
	if len(answer) <= dns.MinMsgSize {
		t.Fatalf("answer of %d bytes is too small to test with", len(answer))
	}
	cut := FitUDP(plain, answer)
	if len(cut) > dns.MinMsgSize {
		t.Errorf("cut answer has %d bytes, want at most %d", len(cut), dns.MinMsgSize)
	}
	return unpackReply(t, q, cut, dns.RcodeSuccess)
}

// TestFitUDPUncuttable gives FitUDP answers that dns.Msg.Truncate leaves too
// big: signed with TSIG, or carrying many questions. They are cut to the
// header and question with the truncated bit.
func TestFitUDPUncuttable(t *testing.T) {
	q, plain := query(t, "many.test.")
	answer := func(edit func(*dns.Msg)) []byte {
		r := new(dns.Msg).SetReply(q)
		for i := range 40 {
			r.Answer = append(r.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: "many.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A:   net.IPv4(192, 0, 2, byte(i)),
			})
		}
		edit(r)
		b, err := r.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, edit := range map[string]func(*dns.Msg){
		"tsig": func(r *dns.Msg) {
			r.Extra = append(r.Extra, &dns.TSIG{
				Hdr:       dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
				Algorithm: dns.HmacSHA256, TimeSigned: 1, Fudge: 300, OrigId: r.Id,
			})
		},
		"questions": func(r *dns.Msg) {
			for i := range 40 {
				r.Question = append(r.Question, dns.Question{Name: fmt.Sprintf("q%d-%s.test.", i, strings.Repeat("x", 20)), Qtype: dns.TypeA, Qclass: dns.ClassINET})
			}
			r.Answer = nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			reply := fitPlainUDP(t, q, plain, answer(edit))
			if !reply.Truncated || len(reply.Answer) != 0 || len(reply.Question) != 1 {
				t.Errorf("cut answer: TC=%v with %d records and %d questions, want TC, none and 1", reply.Truncated, len(reply.Answer), len(reply.Question))
			}
		})
	}
}
