package middleware_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/middleware"
)

func subject(l *middleware.Limiter, c call) string {
	ctx, _ := c.context(methodGet)
	return middleware.Subject(l, ctx)
}

func TestSubject(t *testing.T) {
	proxies := []middleware.Option{middleware.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"))}
	long := strings.Repeat("a", 300)
	for _, tc := range []struct {
		name string
		opts []middleware.Option
		c    call
		want string
	}{
		{name: "ipv4 peer", c: call{addr: "203.0.113.7:5000"}, want: "a:203.0.113.7"},
		{name: "mapped ipv4 peer", c: call{addr: "[::ffff:203.0.113.7]:5000"}, want: "a:203.0.113.7"},
		{name: "ipv6 peer /64", c: call{addr: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:5000"}, want: "a:2001:db8:1:2::"},
		{name: "ipv6 /48", opts: []middleware.Option{middleware.WithAddressBits(24, 48)}, c: call{addr: "[2001:db8:1:2::1]:5000"}, want: "a:2001:db8:1::"},
		{name: "ipv4 /24", opts: []middleware.Option{middleware.WithAddressBits(24, 48)}, c: call{addr: "203.0.113.7:5000"}, want: "a:203.0.113.0"},
		{name: "no peer", c: call{}, want: "a:-"},
		{name: "api key", c: call{addr: "203.0.113.7:1", md: apiKeyMD(acmeKey)}, want: "t:acme"},
		{name: "bearer", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("authorization", "Bearer "+globexKey)}, want: "t:globex"},
		{name: "bearer lower case", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("authorization", "bearer "+globexKey)}, want: "t:globex"},
		{name: "basic auth", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("authorization", "Basic "+globexKey)}, want: "a:203.0.113.7"},
		{name: "x-api-key wins", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("x-api-key", acmeKey, "authorization", "Bearer "+globexKey)}, want: "t:acme"},
		{name: "unknown key", c: call{addr: "203.0.113.7:1", md: apiKeyMD("made-up-key")}, want: "a:203.0.113.7"},
		{name: "two keys", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("x-api-key", acmeKey, "x-api-key", globexKey)}, want: "a:203.0.113.7"},
		{name: "oversized key", c: call{addr: "203.0.113.7:1", md: apiKeyMD(long)}, want: "a:203.0.113.7"},
		{name: "non-ascii key", c: call{addr: "203.0.113.7:1", md: apiKeyMD("ключ-ключ-ключ")}, want: "a:203.0.113.7"},
		{name: "custom header", opts: []middleware.Option{middleware.WithAPIKeyHeaders("x-token")}, c: call{addr: "203.0.113.7:1", md: metadata.Pairs("x-token", acmeKey, "x-api-key", globexKey)}, want: "t:acme"},
		{name: "keys off", opts: []middleware.Option{middleware.WithAPIKeyHeaders()}, c: call{addr: "203.0.113.7:1", md: apiKeyMD(acmeKey)}, want: "a:203.0.113.7"},
		{name: "spoofed xff, untrusted peer", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("x-forwarded-for", "198.51.100.1")}, want: "a:203.0.113.7"},
		{name: "spoofed x-real-ip, untrusted peer", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("x-real-ip", "198.51.100.1")}, want: "a:203.0.113.7"},
		{name: "xff from trusted proxy", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "xff right to left", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1, 198.51.100.1, 10.2.2.2")}, want: "a:198.51.100.1"},
		{name: "xff several lines", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1", "x-forwarded-for", "198.51.100.9, 10.3.3.3")}, want: "a:198.51.100.9"},
		{name: "xff with port", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "198.51.100.1:4711")}, want: "a:198.51.100.1"},
		{name: "xff ipv6", opts: proxies, c: call{addr: "[fd00::1]:1", md: metadata.Pairs("x-forwarded-for", "2001:db8:7:7::1")}, want: "a:2001:db8:7:7::"},
		{name: "xff garbage", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1, not-an-ip")}, want: "a:10.1.1.1"},
		{name: "xff zone", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "fe80::1%eth0")}, want: "a:10.1.1.1"},
		{name: "xff all trusted", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "10.9.9.9, 10.2.2.2")}, want: "a:10.9.9.9"},
		{name: "xff oversized", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", strings.Repeat("1.1.1.1,", 1000)+"198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "xff padded by the client", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", strings.Repeat("x", 3000)+", 198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "xff cut among trusted hops", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", strings.Repeat("1", 3000)+", 10.2.2.2")}, want: "a:10.2.2.2"},
		{name: "xff bracketed ipv6", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "[2001:db8:7:7::1]")}, want: "a:2001:db8:7:7::"},
		{name: "xff bracketed ipv4", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "[198.51.100.1]")}, want: "a:10.1.1.1"},
		{name: "x-real-ip from trusted proxy", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-real-ip", "198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "x-real-ip, last line", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-real-ip", "1.1.1.1", "x-real-ip", "198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "xff before x-real-ip", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1", "x-real-ip", "198.51.100.1")}, want: "a:1.1.1.1"},
		{name: "x-real-ip only", opts: append(proxies, middleware.WithClientAddressHeader("x-real-ip")), c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1", "x-real-ip", "198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "x-real-ip only, missing", opts: append(proxies, middleware.WithClientAddressHeader("x-real-ip")), c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1")}, want: "a:10.1.1.1"},
		{name: "xff only", opts: append(proxies, middleware.WithClientAddressHeader("X-Forwarded-For")), c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-real-ip", "198.51.100.1")}, want: "a:10.1.1.1"},
		{name: "spoofed forwarded, untrusted peer", c: call{addr: "203.0.113.7:1", md: metadata.Pairs("forwarded", "for=198.51.100.1")}, want: "a:203.0.113.7"},
		{name: "forwarded from trusted proxy", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", "for=198.51.100.1;proto=https;by=10.1.1.1")}, want: "a:198.51.100.1"},
		{name: "forwarded right to left", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", "for=1.1.1.1, For=198.51.100.1, for=10.2.2.2")}, want: "a:198.51.100.1"},
		{name: "forwarded quoted ipv6 with port", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", `for="[2001:db8:7:7::1]:4711"`)}, want: "a:2001:db8:7:7::"},
		{name: "forwarded unknown", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", "for=unknown")}, want: "a:10.1.1.1"},
		{name: "forwarded obfuscated", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", "for=_hidden, for=10.2.2.2")}, want: "a:10.2.2.2"},
		{name: "forwarded without for", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", "proto=https")}, want: "a:10.1.1.1"},
		{name: "forwarded unterminated quote", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", `for="198.51.100.1`)}, want: "a:10.1.1.1"},
		{name: "forwarded oversized", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", strings.Repeat("for=1.1.1.1,", 1000)+"for=198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "xff before forwarded", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1", "forwarded", "for=198.51.100.1")}, want: "a:1.1.1.1"},
		{name: "forwarded only", opts: append(proxies, middleware.WithClientAddressHeader("Forwarded")), c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "1.1.1.1", "forwarded", "for=198.51.100.1")}, want: "a:198.51.100.1"},
		{name: "forwarded before x-real-ip", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("forwarded", "for=198.51.100.1", "x-real-ip", "1.1.1.1")}, want: "a:198.51.100.1"},
		{name: "tenant behind proxy", opts: proxies, c: call{addr: "10.1.1.1:1", md: metadata.Pairs("x-forwarded-for", "198.51.100.1", "x-api-key", acmeKey)}, want: "t:acme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.opts...)
			if got := subject(f.l, tc.c); got != tc.want {
				t.Errorf("subject = %q, want %q", got, tc.want)
			}
		})
	}
}

func tlsContext(cn string) context.Context {
	leaf := &x509.Certificate{Subject: pkix.Name{CommonName: cn}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}}
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 1},
		AuthInfo: info,
	})
}

func TestTLSIdentity(t *testing.T) {
	f := newFixture(t)
	if got, want := middleware.Subject(f.l, tlsContext("globex")), "t:globex"; got != want {
		t.Errorf("verified cert: subject = %q, want %q", got, want)
	}
	if got, want := middleware.Subject(f.l, tlsContext("nobody")), "a:203.0.113.7"; got != want {
		t.Errorf("unknown cert: subject = %q, want %q", got, want)
	}
	// An unverified certificate names nobody.
	unverified := peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 1},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "acme"}}}}},
	})
	if got, want := middleware.Subject(f.l, unverified), "a:203.0.113.7"; got != want {
		t.Errorf("unverified cert: subject = %q, want %q", got, want)
	}
	off := newFixture(t, middleware.WithTLSIdentity(nil))
	if got, want := middleware.Subject(off.l, tlsContext("globex")), "a:203.0.113.7"; got != want {
		t.Errorf("TLS identity off: subject = %q, want %q", got, want)
	}
}

func TestKeyFunc(t *testing.T) {
	f := newFixture(t, middleware.WithKeyFunc(func(ctx context.Context, _ string) (string, bool) {
		id, ok := ctx.Value(userKey{}).(string)
		return id, ok
	}))
	base := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 1}})
	for _, tc := range []struct {
		ctx  context.Context
		want string
	}{
		{context.WithValue(base, userKey{}, "acme"), "t:acme"},
		{context.WithValue(base, userKey{}, "made-up"), "a:203.0.113.7"},
		{metadata.NewIncomingContext(base, apiKeyMD(globexKey)), "t:globex"},
	} {
		if got := middleware.Subject(f.l, tc.ctx); got != tc.want {
			t.Errorf("subject = %q, want %q", got, tc.want)
		}
	}
}

type userKey struct{}

// TestMadeUpKeysShareOneBucket: a client rotating thousands of made-up API
// keys from one address is one anonymous caller with one bucket.
func TestMadeUpKeysShareOneBucket(t *testing.T) {
	f := newFixture(t)
	admitted := 0
	for i := range 5000 {
		c := call{addr: "203.0.113.7:5000", md: apiKeyMD("made-up-" + strconv.Itoa(i))}
		if ran, _, _, _ := unary(f.l, c, methodGet); ran {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("admitted %d calls, want the anonymous burst of 2", admitted)
	}
	if got := f.store.Len(); got != 1 {
		t.Errorf("store tracks %d buckets, want 1", got)
	}
}

// TestSpoofedForwardingIgnored: an untrusted client rotating
// x-forwarded-for values keeps its own bucket.
func TestSpoofedForwardingIgnored(t *testing.T) {
	f := newFixture(t)
	admitted := 0
	for i := range 1000 {
		c := call{addr: "203.0.113.7:5000", md: metadata.Pairs("x-forwarded-for", "198.51."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256), "x-real-ip", "192.0.2."+strconv.Itoa(i%256))}
		if ran, _, _, _ := unary(f.l, c, methodGet); ran {
			admitted++
		}
	}
	if admitted != 2 || f.store.Len() != 1 {
		t.Errorf("admitted %d in %d buckets, want 2 in 1", admitted, f.store.Len())
	}
}

func TestHostileMetadataNeverRejects(t *testing.T) {
	f := newFixture(t, middleware.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))
	huge := strings.Repeat("\xff\x00", 8<<10)
	for _, md := range []metadata.MD{
		{"x-api-key": {huge}},
		{"authorization": {"Bearer " + huge}},
		{"authorization": {"Bearer"}},
		{"x-forwarded-for": {huge}},
		{"x-forwarded-for": {",,,,", ""}},
		{"x-real-ip": {huge, huge}},
		{"x-api-key": {}},
	} {
		c := call{addr: "10.1.1.1:1", md: md}
		if ran, d, _, err := unary(f.l, c, methodGet); !ran || err != nil || d.Tenant != "" {
			t.Errorf("metadata %.40q: ran %v, err %v, tenant %q; want admitted as anonymous", md, ran, err, d.Tenant)
		}
		f.clock.Advance(2 * 1e9)
	}
}

func FuzzWalkForwarded(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "1.2.3.4, 10.0.0.1", " , ,", "[::1]:80, 10.0.0.2", "fe80::1%eth0", "10.0.0.1,10.0.0.2,10.0.0.3", "::ffff:1.2.3.4"} {
		f.Add(s, "10.9.9.9")
	}
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	f.Fuzz(func(t *testing.T, header, second string) {
		peer := netip.MustParseAddr("10.0.0.1")
		got := middleware.WalkForwarded(peer, []string{header, second}, trusted.Contains)
		if !got.IsValid() {
			t.Fatalf("WalkForwarded(%q, %q) = invalid address", header, second)
		}
		if got.Zone() != "" || got.Is4In6() {
			t.Errorf("WalkForwarded(%q, %q) = %v, want no zone and unmapped", header, second, got)
		}
		// The result is the peer or an address the headers name.
		if got != peer && !strings.Contains(header+","+second, strings.TrimPrefix(got.String(), "::ffff:")) && !mentions(header+","+second, got) {
			t.Errorf("WalkForwarded(%q, %q) = %v, an address the headers do not name", header, second, got)
		}
	})
}

// mentions reports whether some comma-separated hop of s parses to a.
func mentions(s string, a netip.Addr) bool {
	for _, hop := range strings.Split(s, ",") {
		if b, ok := middleware.ParseHop(hop); ok && b == a {
			return true
		}
	}
	return false
}

func FuzzParseHop(f *testing.F) {
	for _, s := range []string{"1.2.3.4", " 1.2.3.4:80 ", "[2001:db8::1]:443", "::ffff:10.0.0.1", "fe80::1%25eth0", "", "999.1.1.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := middleware.ParseHop(s)
		if ok && (!a.IsValid() || a.Zone() != "" || a.Is4In6()) {
			t.Errorf("ParseHop(%q) = %v, want a valid unmapped address without zone", s, a)
		}
		if !ok && a.IsValid() {
			t.Errorf("ParseHop(%q) = %v, false", s, a)
		}
	})
}

func FuzzParseForwarded(f *testing.F) {
	for _, s := range []string{"for=1.2.3.4", `for="[::1]:80";proto=https`, "by=1.1.1.1;for=unknown", `for="`, "for=;for=1.1.1.1", ";;", "FOR=_x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := middleware.ParseForwarded(s)
		if ok && (!a.IsValid() || a.Zone() != "" || a.Is4In6()) {
			t.Errorf("ParseForwarded(%q) = %v, want a valid unmapped address without zone", s, a)
		}
		if !ok && a.IsValid() {
			t.Errorf("ParseForwarded(%q) = %v, false", s, a)
		}
	})
}

func FuzzBearer(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer  abc", "Basic abc", "Bearer", "BEARER x", "Bearer\xffx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := middleware.Bearer(s)
		if tok != "" && (len(s) < 8 || !strings.HasSuffix(s, tok) || !strings.EqualFold(s[:7], "bearer ")) {
			t.Errorf("Bearer(%q) = %q", s, tok)
		}
		_ = utf8.ValidString(tok)
	})
}

// FuzzSubject: any metadata from any peer resolves without panicking to a
// known tenant or an anonymous address subject.
func FuzzSubject(f *testing.F) {
	f.Add("203.0.113.7", "x-api-key", acmeKey, "1.1.1.1")
	f.Add("10.1.1.1", "authorization", "Bearer "+globexKey, "1.1.1.1, 10.2.2.2")
	f.Add("::1", "x-api-key", "\x00\xff", ",,,")
	l := newFixture(f, middleware.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))).l
	f.Fuzz(func(t *testing.T, ip, name, value, xff string) {
		ctx := context.Background()
		if a := net.ParseIP(ip); a != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: a}})
		}
		ctx = metadata.NewIncomingContext(ctx, metadata.MD{strings.ToLower(name): {value}, "x-forwarded-for": {xff}})
		s := middleware.Subject(l, ctx)
		switch {
		case s == "t:acme", s == "t:globex", s == "a:-":
		case strings.HasPrefix(s, "a:"):
			if _, err := netip.ParseAddr(s[2:]); err != nil {
				t.Errorf("subject %q: not an address: %v", s, err)
			}
		default:
			t.Errorf("subject = %q", s)
		}
	})
}

func TestUnknownCertificateFallsThroughToAPIKey(t *testing.T) {
	f := newFixture(t)
	ctx := metadata.NewIncomingContext(tlsContext("spiffe-workload"), apiKeyMD(acmeKey))
	if got, want := middleware.Subject(f.l, ctx), "t:acme"; got != want {
		t.Errorf("subject = %q, want %q", got, want)
	}
	ctx = metadata.NewIncomingContext(tlsContext("globex"), apiKeyMD(acmeKey))
	if got, want := middleware.Subject(f.l, ctx), "t:globex"; got != want {
		t.Errorf("known certificate and key: subject = %q, want the certificate's %q", got, want)
	}
}
