package middleware

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// A route is where one caller's calls to one method go: the rule they are
// held to and the key of their bucket. Routes are immutable and cached, so
// that a caller seen before costs neither a rule lookup nor a key built and
// allocated, on either outcome: a rejection allocates nothing, and the key
// the store receives is never a buffer reused by a later call.
type route struct {
	who     unsafe.Pointer // what the route is cached by: the tenant, or the peer's address
	ten     *tenant.Tenant // the tenant, or the anonymous policy
	method  string
	rule    tenant.Rule
	key     string // the bucket key; key[:subject] is the subject
	subject uint8
	found   bool // ten is a known tenant, not the anonymous policy
	flow    overload.Flow
}

// flowOf returns the overload controller's flow of calls held to rule for
// ten, keyed by subject.
func flowOf(ten *tenant.Tenant, rule tenant.Rule, subject string) overload.Flow {
	name := rule.Priority
	if name == "" {
		name = ten.Priority()
	}
	prio, _ := overload.ParsePriority(name) // validated by the tenant table
	return overload.Flow{Key: subject, Weight: ten.Weight(), Priority: prio}
}

// routeCache is a two-way set-associative table of routes: one atomic
// pointer per slot, two slots per set on one cache line, so a lookup is a
// multiplication and one or two loads and comparisons, with no lock, and
// memory never grows. A route that finds both slots of its set taken
// replaces one at random, and each miss builds its route anew (the cost
// every call paid before routes were cached): with two ways, thousands of
// connections rarely contend for a set. A slot keeps its route's tenant or
// peer address reachable until it is replaced; after a reload the old
// tenants simply stop matching.
type routeCache struct {
	slots [routeSlots]atomic.Pointer[route]
}

const (
	routeBits  = 13
	routeSlots = 1 << routeBits
)

// slot hashes the identity's pointer with the method's length and last
// eight bytes: the content, not the address, since a method string may be
// a new copy on every call (grpc.Method on a stream's header).
func (c *routeCache) set(who unsafe.Pointer, method string) *[2]atomic.Pointer[route] {
	h := uint64(uintptr(who)) ^ uint64(len(method))<<56
	if n := len(method); n >= 8 {
		h ^= binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(method[n-8:]), 8))
	}
	i := (h * 0x9e3779b97f4a7c15) >> (64 - routeBits) &^ 1
	return (*[2]atomic.Pointer[route])(c.slots[i : i+2])
}

func (c *routeCache) get(who unsafe.Pointer, ten *tenant.Tenant, method string) *route {
	set := c.set(who, method)
	for i := range set {
		r := set[i].Load()
		if r != nil && r.who == who && r.ten == ten && r.method == method {
			return r
		}
	}
	return nil
}

func (c *routeCache) put(r *route) {
	set := c.set(r.who, r.method)
	for i := range set {
		if set[i].Load() == nil {
			set[i].Store(r)
			return
		}
	}
	set[rand.Uint32()&1].Store(r)
}

// noAddr is the identity of every connection without an IP address: they
// share the subject "a:-".
var noAddr byte

// peerIdentity returns what an anonymous caller's route may be cached by:
// the address object of its connection, which grpc-go keeps for the
// connection's life, or noAddr. It returns nil when the address must be
// resolved on every call: the peer is a trusted proxy, whose forwarding
// headers name the client, or its address is not an object kept per
// connection (ServeHTTP's is a string per request).
func (l *Limiter) peerIdentity(p *peer.Peer) unsafe.Pointer {
	if p == nil {
		return unsafe.Pointer(&noAddr)
	}
	var who unsafe.Pointer
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		who = unsafe.Pointer(a)
	case *net.UDPAddr:
		who = unsafe.Pointer(a)
	default:
		if addrOf(p).IsValid() {
			return nil
		}
		return unsafe.Pointer(&noAddr)
	}
	if who == nil {
		return unsafe.Pointer(&noAddr)
	}
	if len(l.o.trusted) > 0 {
		if a := addrOf(p); a.IsValid() && l.isTrusted(a) {
			return nil
		}
	}
	return who
}

// route returns the route of a call to method by the caller identified as
// ten (found) on connection p, from the cache when it can.
func (l *Limiter) route(ten *tenant.Tenant, found bool, p *peer.Peer, h header, method string) *route {
	var who unsafe.Pointer
	if found {
		who = unsafe.Pointer(ten)
	} else {
		who = l.peerIdentity(p)
	}
	if who != nil {
		if r := l.routes.get(who, ten, method); r != nil {
			return r
		}
	}
	r := &route{who: who, ten: ten, method: method, rule: ten.Rule(method), found: found}
	var buf [keyBufLen]byte
	b := l.appendSubject(buf[:0], ten, found, p, h)
	r.subject = uint8(len(b))
	b = append(b, ':')
	b = append(b, r.rule.ID...)
	r.key = string(b)
	r.flow = flowOf(ten, r.rule, r.key[:r.subject])
	if who != nil {
		l.routes.put(r)
	}
	return r
}
