package middleware

import (
	"crypto/x509"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/tenant"
)

// Bounds on what the identity parsers look at. Hostile metadata is never a
// reason to reject: past these bounds a header is ignored and the caller is
// anonymous, keyed by its address.
const (
	// maxHops is the most x-forwarded-for entries walked, right to left.
	maxHops = 16
	// maxForwardedLen bounds one x-forwarded-for or x-real-ip value.
	maxForwardedLen = 2048
	// maxAuthLen bounds an API key header value: "Bearer " and a key of at
	// most tenant.MaxKeyLen bytes.
	maxAuthLen = len("Bearer ") + tenant.MaxKeyLen
)

// addrOf returns a gRPC peer's IP address, unmapped, or the zero Addr
// when the connection has none (a Unix socket, an in-memory pipe).
func addrOf(peer net.Addr) netip.Addr {
	var a netip.Addr
	switch addr := peer.(type) {
	case *net.TCPAddr:
		if addr != nil {
			a, _ = netip.AddrFromSlice(addr.IP)
		}
	case *net.UDPAddr:
		if addr != nil {
			a, _ = netip.AddrFromSlice(addr.IP)
		}
	case nil, *net.UnixAddr:
	default:
		// Other transports name the peer by a string: grpc.Server's
		// ServeHTTP gives the HTTP request's "ip:port".
		a = parseAddr(addr.String())
	}
	return a.Unmap()
}

// parseAddr parses "ip:port" or "ip", or returns the zero Addr. Strings
// that cannot be either (a pipe's "bufconn", say) are refused before
// parsing, whose errors allocate.
func parseAddr(s string) netip.Addr {
	if s == "" || len(s) > len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535") {
		return netip.Addr{}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F', c == '.', c == ':', c == '[', c == ']':
		case c == '%':
			i = len(s) // an IPv6 zone ("fe80::1%eth0"): any name
		default:
			return netip.Addr{}
		}
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr()
	}
	a, _ := netip.ParseAddr(s)
	return a
}

// forwarded returns the client's address: the call's peer, or the client
// its forwarding headers name when the peer is a trusted proxy.
func (l *Limiter) forwarded(c *Call) netip.Addr {
	a, h := c.Addr.Unmap(), l.o.fwdHeader
	if !a.IsValid() || !l.isTrusted(a) {
		return a
	}
	if h == "" || h == "x-forwarded-for" {
		if xff := c.values("x-forwarded-for"); len(xff) > 0 {
			return walkForwarded(a, xff, l.isTrusted, parseHop)
		}
	}
	if h == "" || h == "forwarded" {
		if fwd := c.values("forwarded"); len(fwd) > 0 {
			return walkForwarded(a, fwd, l.isTrusted, parseForwarded)
		}
	}
	if h == "" || h == "x-real-ip" {
		// The last line: a proxy that adds a line rather than replacing
		// the client's adds it last.
		if rip := c.values("x-real-ip"); len(rip) > 0 {
			if client, ok := parseHop(rip[len(rip)-1]); ok {
				return client
			}
		}
	}
	return a
}

func (l *Limiter) isTrusted(a netip.Addr) bool {
	for _, p := range l.o.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// walkForwarded walks x-forwarded-for or forwarded values right to left,
// parsing each entry with parse, starting from the trusted peer: each hop
// that is itself trusted passes the question on to the hop before it, and
// the first untrusted hop is the client. A malformed hop or more than
// maxHops trusted hops stop the walk at the last trusted address reached:
// what lies beyond it cannot be believed. Several header lines count as
// one list, in order.
//
// Of a value longer than maxForwardedLen only the last maxForwardedLen
// bytes are read, and the entry they cut is malformed: proxies append to
// what the client sent, so the entries the trusted hops wrote are on the
// right, and a client that pads its own part must not push them out of
// reach (which would leave the proxy's address, shared by all its clients,
// as the caller's).
func walkForwarded(peer netip.Addr, values []string, trusted func(netip.Addr) bool, parse func(string) (netip.Addr, bool)) netip.Addr {
	last := peer
	hops := 0
	for i := len(values) - 1; i >= 0; i-- {
		rest := values[i]
		cut := len(rest) > maxForwardedLen
		if cut {
			rest = rest[len(rest)-maxForwardedLen:]
		}
		for {
			j := strings.LastIndexByte(rest, ',')
			if j < 0 && cut {
				return last
			}
			c, ok := parse(rest[j+1:])
			if !ok {
				return last
			}
			if !trusted(c) {
				return c
			}
			last = c
			if hops++; hops >= maxHops {
				return last
			}
			if j < 0 {
				break
			}
			rest = rest[:j]
		}
	}
	return last
}

// parseHop parses one forwarding entry: an address, optionally in brackets
// or with a port ("1.2.3.4:80", "[::1]", "[::1]:80"), surrounded by
// optional spaces. Zones are refused: they name an interface of the proxy,
// not a client.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535") || strings.IndexByte(s, '%') >= 0 {
		return netip.Addr{}, false
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return a.Unmap(), true
		}
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// parseForwarded parses the for= of one RFC 7239 Forwarded element, as
// in `for=192.0.2.60;proto=https` or `for="[2001:db8::1]:4711"`. An
// element without one, or naming no address ("unknown", an obfuscated
// "_name"), is malformed: the walk stops there.
func parseForwarded(s string) (netip.Addr, bool) {
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, ";")
		name, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return parseHop(v)
	}
	return netip.Addr{}, false
}

// aggregate masks an address to the configured prefix length.
func (l *Limiter) aggregate(a netip.Addr) netip.Addr {
	if !a.IsValid() {
		return a
	}
	bits := l.o.v6Bits
	if a.Is4() {
		bits = l.o.v4Bits
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a
	}
	return p.Addr()
}

// keyNote says why a call's API key header was not used: the caller is
// then anonymous, and its rejections and events say why
// (Rejection.KeyIgnored, Decision.KeyIgnored).
type keyNote uint8

const (
	noteNone keyNote = iota
	// noteRepeated: the header has more than one value. Which one is the
	// caller's is not guessed: a proxy or metadata.AppendToOutgoingContext
	// may have added either.
	noteRepeated
	// noteTooLong: the value is longer than any key can be.
	noteTooLong
	nNotes
)

var noteNames = [nNotes]string{"", "repeated", "too_long"}

// apiKey returns the API key the call presents, or "" when it presents none
// usable: only the first configured header present counts, it must have one
// value, and the value must be of a plausible size; the note says which
// was not so. Whether the key is well-formed is the tenant table's
// business (tenant.Table.TenantByKey).
func (l *Limiter) apiKey(c *Call) (string, keyNote) {
	for _, name := range l.o.keyHeaders {
		vals := c.values(name)
		if len(vals) == 0 {
			continue
		}
		if len(vals) != 1 {
			return "", noteRepeated
		}
		if len(vals[0]) > maxAuthLen {
			return "", noteTooLong
		}
		if name == "authorization" {
			return bearer(vals[0]), noteNone
		}
		return vals[0], noteNone
	}
	return "", noteNone
}

// bearer returns the token of an "authorization: Bearer <token>" value, or
// "" for any other scheme.
func bearer(v string) string {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return ""
	}
	return strings.TrimLeft(v[len(scheme):], " ")
}

// certTenant returns the tenant ID the call's verified client certificate
// names.
func (l *Limiter) certTenant(c *Call) (string, bool) {
	if l.o.tlsIdentity == nil || c.Cert == nil {
		return "", false
	}
	return l.o.tlsIdentity(c.Cert)
}

// verifiedCert returns the verified client certificate of a gRPC
// connection, or nil.
func verifiedCert(p *peer.Peer) *x509.Certificate {
	if p == nil || p.AuthInfo == nil {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}
