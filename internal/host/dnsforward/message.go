package dnsforward

import (
	"strings"

	"github.com/miekg/dns"
)

// headerLen is the size of a DNS message header (RFC 1035 4.1.1); a query
// shorter than it has no ID to answer.
const headerLen = 12

// ednsSize is the UDP payload size advertised in replies built here: the
// DNS Flag Day 2020 value, which avoids IP fragmentation.
const ednsSize = 1232

// Fail answers query with rcode, a 4-bit DNS RCODE such as
// dns.RcodeRefused or dns.RcodeServerFailure, without forwarding it. The
// reply carries the query's ID and question. A malformed query gets FORMERR
// instead, and a query too short to carry an ID, or that is itself a
// response, gets nil: drop it.
func Fail(query []byte, rcode int) []byte {
	q, reply := parse(query)
	if q == nil {
		return reply
	}
	return respond(q, rcode)
}

// maxUDPPayload is the most a UDP datagram carries over IPv4 (65535 less
// the IP and UDP headers), a little less than over IPv6.
const maxUDPPayload = 65507

// FitUDP returns answer cut to what query allows in a UDP reply: the payload
// size of its EDNS0 record, or 512 bytes without one (RFC 6891 6.2.5), and
// never more than a datagram carries (an EDNS0 size of 65535 allows more).
// Records that do not fit are dropped and the TC bit is set, so the guest
// asks again over TCP. An answer that fits or cannot be parsed is returned
// unchanged. Answers over TCP need no cut.
func FitUDP(query, answer []byte) []byte {
	if len(answer) <= dns.MinMsgSize {
		return answer
	}
	var q dns.Msg
	if q.Unpack(query) != nil {
		return answer
	}
	size := dns.MinMsgSize
	if opt := q.IsEdns0(); opt != nil {
		size = min(max(size, int(opt.UDPSize())), maxUDPPayload)
	}
	if len(answer) <= size {
		return answer
	}
	var r dns.Msg
	if r.Unpack(answer) != nil {
		return answer
	}
	r.Truncate(size)
	cut, err := r.Pack()
	if err == nil {
		// Some records unpack leniently but pack into bytes that no longer
		// parse (a TSIG whose lengths overflow): never send those.
		err = new(dns.Msg).Unpack(cut)
	}
	if err == nil && len(cut) <= size {
		return cut
	}
	// Truncate keeps what it cannot cut (every question, the OPT record, an
	// answer signed with TSIG), so the result may still be too big. Cut to
	// the header and the query's first question instead: the guest, seeing
	// the truncated bit, asks again over TCP. A name is at most 255 bytes,
	// so this fits in 512.
	head := new(dns.Msg).SetReply(&q)
	head.Rcode, head.Truncated = r.Rcode, true
	if opt := q.IsEdns0(); opt != nil {
		head.SetEdns0(uint16(size), opt.Do())
	} else if head.Rcode > 0xF {
		// An extended code needs an OPT record the guest did not ask for.
		head.Rcode = dns.RcodeServerFailure
	}
	if cut, err = head.Pack(); err != nil {
		return answer
	}
	return cut
}

// parse unpacks query for forwarding. When it cannot be forwarded, parse
// returns a nil message and the reply to send instead: FORMERR, or nil to
// drop it.
func parse(query []byte) (*dns.Msg, []byte) {
	q := new(dns.Msg)
	err := q.Unpack(query)
	switch {
	case len(query) < headerLen:
		return nil, nil
	case q.Response:
		// Answering a response could start a loop between two resolvers.
		return nil, nil
	case err != nil:
		return nil, pack(new(dns.Msg).SetRcodeFormatError(q))
	case len(q.Question) != 1:
		// RFC 9619: a query has exactly one question.
		return nil, respond(q, dns.RcodeFormatError)
	}
	return q, nil
}

// respond builds the reply with rcode to q, a parsed query.
func respond(q *dns.Msg, rcode int) []byte {
	r := new(dns.Msg).SetRcode(q, rcode)
	r.RecursionAvailable = true
	// RFC 6891 7: a query with an OPT record gets one back.
	if q.IsEdns0() != nil {
		r.SetEdns0(ednsSize, false)
	}
	return pack(r)
}

// pack returns m in wire format, or nil when m cannot be packed, such as
// with an rcode above 15.
func pack(m *dns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

// matches reports whether answer is the upstream's response to q: the same
// ID and, when it carries one, the same question. An answer with the TC bit
// needs only a matching header, since an upstream may cut it at any byte.
func matches(q *dns.Msg, answer []byte) bool {
	var r dns.Msg
	err := r.Unpack(answer)
	if len(answer) < headerLen || !r.Response || r.Id != q.Id {
		return false
	}
	if err != nil {
		return r.Truncated
	}
	if len(r.Question) == 0 {
		return true
	}
	a, b := r.Question[0], q.Question[0]
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}
