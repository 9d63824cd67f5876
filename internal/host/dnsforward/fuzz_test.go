package dnsforward

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/miekg/dns"
)

// seedQuery is a well-formed query, with EDNS0 when size is not zero.
func seedQuery(name string, size uint16) []byte {
	q := new(dns.Msg).SetQuestion(name, dns.TypeA)
	if size != 0 {
		q.SetEdns0(size, false)
	}
	b, _ := q.Pack()
	return b
}

// seedAnswer is an upstream's answer to query with n A records.
func seedAnswer(query []byte, n int) []byte {
	q := new(dns.Msg)
	q.Unpack(query)
	r := new(dns.Msg).SetReply(q)
	for i := range n {
		rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 192.0.2." + string(rune('0'+i%10)))
		r.Answer = append(r.Answer, rr)
	}
	b, _ := r.Pack()
	return b
}

// checkReply checks a reply built here for query: nil (dropped), or a
// response that parses and carries the query's ID.
func checkReply(t *testing.T, query, reply []byte) {
	t.Helper()
	if reply == nil {
		return
	}
	var r dns.Msg
	if err := r.Unpack(reply); err != nil {
		t.Fatalf("reply to % x does not parse: %v", query, err)
	}
	if !r.Response || len(query) < 2 || r.Id != binary.BigEndian.Uint16(query) {
		t.Fatalf("reply %v to % x is not a response with the query's ID", &r, query)
	}
}

// FuzzFail feeds Fail what a guest may send to its link DNS address.
func FuzzFail(f *testing.F) {
	f.Add(seedQuery("example.com.", 0))
	f.Add(seedQuery("example.com.", 4096))
	f.Add([]byte{0, 1})
	f.Fuzz(func(t *testing.T, query []byte) {
		reply := Fail(query, dns.RcodeRefused)
		checkReply(t, query, reply)
		if reply != nil {
			var r dns.Msg
			r.Unpack(reply)
			if r.Rcode != dns.RcodeRefused && r.Rcode != dns.RcodeFormatError {
				t.Fatalf("Fail answered % x with rcode %d", query, r.Rcode)
			}
		}
	})
}

// FuzzAnswer feeds Answer a guest's query and the bytes an upstream answers
// over TCP: whatever it answers, the guest gets the answer unchanged when it
// matches the query, else a reply built here.
func FuzzAnswer(f *testing.F) {
	q := seedQuery("example.com.", 1232)
	f.Add(q, seedAnswer(q, 1))
	f.Add(q, seedAnswer(seedQuery("other.example.", 0), 1))
	f.Add(q, []byte{})
	f.Fuzz(func(t *testing.T, query, upstream []byte) {
		upstream = upstream[:min(len(upstream), dns.MaxMsgSize)]
		fwd := &Forwarder{Upstream: Upstream{Protocol: TCP, Address: "upstream.test:53"},
			Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
				c, s := net.Pipe()
				go func() {
					defer s.Close()
					var n [2]byte
					if _, err := io.ReadFull(s, n[:]); err != nil {
						return
					}
					if _, err := io.CopyN(io.Discard, s, int64(binary.BigEndian.Uint16(n[:]))); err != nil {
						return
					}
					s.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(upstream))), upstream...))
				}()
				return c, nil
			}}
		reply := fwd.Answer(context.Background(), query)
		if bytes.Equal(reply, upstream) && reply != nil {
			return // passed through: the upstream's answer matched
		}
		checkReply(t, query, reply)
	})
}

// FuzzFitUDP feeds FitUDP a guest's query and an upstream's answer: what it
// returns in place of the answer parses and fits the query's size, and it
// is marked truncated unless it still holds every record of the answer
// (packed again, with name compression, a long answer may fit whole).
func FuzzFitUDP(f *testing.F) {
	q := seedQuery("example.com.", 0)
	f.Add(q, seedAnswer(q, 40))
	e := seedQuery("example.com.", 600)
	f.Add(e, seedAnswer(e, 60))
	f.Fuzz(func(t *testing.T, query, answer []byte) {
		cut := FitUDP(query, answer)
		if bytes.Equal(cut, answer) {
			return
		}
		var r dns.Msg
		if err := r.Unpack(cut); err != nil {
			t.Fatalf("cut answer does not parse: %v", err)
		}
		var m dns.Msg
		m.Unpack(query)
		size := dns.MinMsgSize
		if opt := m.IsEdns0(); opt != nil {
			size = max(size, int(opt.UDPSize()))
		}
		if len(cut) > size {
			t.Fatalf("cut answer of %d bytes for a size of %d", len(cut), size)
		}
		var whole dns.Msg
		if err := whole.Unpack(answer); err != nil {
			t.Fatalf("FitUDP rewrote an answer that does not parse: %v", err)
		}
		kept := len(r.Answer) == len(whole.Answer) && len(r.Ns) == len(whole.Ns) && len(r.Extra) == len(whole.Extra)
		if !r.Truncated && !kept {
			t.Fatalf("cut answer of %d bytes dropped records without the truncated bit", len(cut))
		}
	})
}
