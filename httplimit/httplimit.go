package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
)

// A Middleware admits HTTP requests through a middleware.Limiter before
// they reach the handlers it wraps (Handle), and answers those it turns
// away in the protocol the client speaks. Build one with New; it is safe
// for concurrent use and holds no goroutine.
type Middleware struct {
	l      *middleware.Limiter
	o      options
	bodies *lru.Cache[*middleware.Rejection, *bodies]
}

// An Option configures a Middleware. New applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of floodgate.ErrInvalidOption).
type Option func(*options)

type options struct {
	method      func(*http.Request) string
	methodSet   bool
	rateHeaders bool
	origins     map[string]bool // WithCORS; "*" for any
}

// WithMethod sets how a request names the method that the Limiter's tenant
// rules and exemptions match: f returns a gRPC full method
// ("/pkg.Svc/Method") or any name the rules know, or "" for the request's
// path. The default is the path, which for Connect, gRPC-Web and gRPC
// (grpc.Server's ServeHTTP) is already "/pkg.Svc/Method". grpc-gateway
// routes need f: map each route to the gRPC method it calls, for instance
// by the ServeMux pattern that matched (http.Request.Pattern, set when
// the Middleware wraps a handler registered on the mux). Whatever f
// returns names an Event's method too: keep the set bounded. f must not
// be nil. A repeated call replaces it.
func WithMethod(f func(*http.Request) string) Option {
	return func(o *options) { o.method, o.methodSet = f, true }
}

// WithRateLimitHeaders sets whether responses carry the RateLimit-Policy
// and RateLimit fields (see the package doc), on admitted requests and
// rejections alike. The default is true. Retry-After on rejections is
// sent either way. A repeated call replaces the setting.
func WithRateLimitHeaders(on bool) Option { return func(o *options) { o.rateHeaders = on } }

// WithCORS lets browsers on the given origins ("https://app.example.com",
// or "*" for any) read the Middleware's answers, as gRPC-Web and Connect
// clients in a browser must to see a rejection's status: responses to a
// request from such an origin carry Access-Control-Allow-Origin and expose
// the gRPC status, Retry-After and RateLimit fields; a rejection answers
// for the handler the Middleware kept it from, which would have set them.
// CORS preflights (OPTIONS with Access-Control-Request-Method) pass to the
// wrapped handler unlimited: the browser sends one before its calls, and
// a refused one would look like a network failure. By default there is no
// CORS. A repeated call adds origins.
func WithCORS(origins ...string) Option {
	return func(o *options) {
		if o.origins == nil {
			o.origins = map[string]bool{}
		}
		for _, s := range origins {
			o.origins[s] = true
		}
	}
}

// exposed are the response fields a browser client reads from the
// Middleware's answers.
const exposed = "Grpc-Status, Grpc-Message, Grpc-Status-Details-Bin, Retry-After, RateLimit, RateLimit-Policy"

// readable reports whether WithCORS lets a browser on origin read the
// Middleware's answers.
func (m *Middleware) readable(origin string) bool {
	return origin != "" && m.o.origins != nil && (m.o.origins[origin] || m.o.origins["*"])
}

// cors adds the CORS fields to h for a request from origin, when the
// Middleware lets that origin read its answers.
func (m *Middleware) cors(h http.Header, origin string) {
	if !m.readable(origin) {
		return
	}
	h["Access-Control-Allow-Origin"] = []string{origin}
	h["Access-Control-Expose-Headers"] = append(h["Access-Control-Expose-Headers"], exposed)
	h["Vary"] = append(h["Vary"], "Origin")
}

// bodyCacheSize bounds the rejection bodies kept built: one per shared
// Rejection of the Limiter (a reason and a retry delay on its grid) in use.
const bodyCacheSize = 1024

// New returns a Middleware deciding requests with l. It returns an error
// wrapping floodgate.ErrInvalidOption when l is nil or an option is
// invalid; the message names the option.
func New(l *middleware.Limiter, opts ...Option) (*Middleware, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: httplimit: New: nil Limiter", floodgate.ErrInvalidOption)
	}
	o := options{rateHeaders: true}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.methodSet && o.method == nil {
		return nil, fmt.Errorf("%w: httplimit: WithMethod: nil function", floodgate.ErrInvalidOption)
	}
	for origin := range o.origins {
		if u, err := url.Parse(origin); origin != "*" && (err != nil || u.Scheme == "" || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil) {
			return nil, fmt.Errorf("%w: httplimit: WithCORS: origin %q, want scheme://host[:port] or *", floodgate.ErrInvalidOption, origin)
		}
	}
	c, err := lru.New[*middleware.Rejection, *bodies](bodyCacheSize)
	if err != nil {
		return nil, err
	}
	return &Middleware{l: l, o: o, bodies: c}, nil
}

// Handle returns a handler that admits each request before next serves
// it, or answers it with a rejection (see the package doc) without calling
// next. An admitted request reaches next with a context carrying its
// Decision (middleware.FromContext), and holds its overload controller
// slot (middleware.WithOverload) until next returns. A request under a
// metered quota settles when next returns, and its Writes reserve chunks
// (see the package doc).
func (m *Middleware) Handle(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.o.origins != nil && r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			next.ServeHTTP(w, r) // a CORS preflight: the wrapped handler answers it
			return
		}
		a, err := m.l.Admit(r.Context(), m.call(r))
		if err != nil {
			m.cors(w.Header(), r.Header.Get("Origin"))
			m.reject(w, r, &a, err)
			return
		}
		defer a.Done()
		if m.o.origins != nil && m.o.rateHeaders && m.readable(r.Header.Get("Origin")) {
			// The wrapped handler's CORS layer does not know the
			// RateLimit fields: expose them.
			w.Header()["Access-Control-Expose-Headers"] = append(w.Header()["Access-Control-Expose-Headers"], "RateLimit, RateLimit-Policy")
		}
		if m.o.rateHeaders {
			if d, ok := a.Decision(); ok {
				setRateLimit(w.Header(), d)
			}
		}
		if ctx := a.Context(); ctx != r.Context() {
			r = r.WithContext(ctx)
		}
		if a.Metered() {
			w = newMeteredWriter(w, m, r, &a)
		}
		next.ServeHTTP(w, r)
	})
}

// meteredWriter covers each Write of a metered request with its
// reservations (middleware.Admission.Send), so that a streamed response
// reserves its quota in chunks as it is written.
type meteredWriter struct {
	http.ResponseWriter
	m *Middleware
	r *http.Request
	a *middleware.Admission
	// A Write longer than burst is covered in pieces of piece bytes: the
	// quota's, as the request was admitted; 0 for no pieces.
	burst, piece int
	sent         bool  // a header or a byte went out
	err          error // the rejection answered in place of the response
}

func newMeteredWriter(w http.ResponseWriter, m *Middleware, r *http.Request, a *middleware.Admission) *meteredWriter {
	mw := &meteredWriter{ResponseWriter: w, m: m, r: r, a: a}
	if d, ok := a.Decision(); ok {
		if mt := d.Rule.Meter; mt != nil && !mt.Limit.IsInf() && mt.Chunk > 0 {
			mw.burst, mw.piece = mt.Limit.Burst, mt.Chunk
		}
	}
	return mw
}

// WriteHeader sends the response's header, unless a refused Write
// answered the request with the rejection instead.
func (w *meteredWriter) WriteHeader(code int) {
	if w.err != nil {
		return
	}
	if code >= 200 { // an informational header leaves the response to come
		w.sent = true
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write writes p once the request's reservations cover it, or returns the
// rejection (middleware.Admission.Send's error), writing nothing more,
// once they cannot. A p longer than the quota's burst, which no
// reservation could cover at once, is covered and written a chunk at a
// time (tenant.Meter.Chunk), so that it writes what the reservations cover
// and returns how much. A refused Write before any header or byte went
// out answers the request with the rejection, as the Middleware answers
// one it refuses, and every later Write returns that error.
func (w *meteredWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	size := len(p)
	if w.piece > 0 && size > w.burst {
		size = w.piece
	}
	n := 0
	for {
		q := p[n:min(n+size, len(p))]
		if err := w.a.Send(q); err != nil {
			if !w.sent {
				w.err, w.sent = err, true
				w.m.refuse(w.ResponseWriter, w.r, err)
			}
			return n, err
		}
		k, err := w.ResponseWriter.Write(q)
		w.sent = true
		n += k
		if err != nil || n == len(p) {
			return n, err
		}
	}
}

// FlushError flushes the response when the ResponseWriter underneath can,
// for http.ResponseController; it sends the header if nothing did.
func (w *meteredWriter) FlushError() error {
	w.sent = true
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush flushes the response when the ResponseWriter underneath can (gRPC's
// ServeHTTP needs an http.Flusher).
func (w *meteredWriter) Flush() { _ = w.FlushError() }

// Unwrap returns the ResponseWriter underneath, for http.ResponseController.
func (w *meteredWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// call describes r for the Limiter: its method, the connection's peer
// (which, when it is a trusted proxy, the forwarding headers may look
// behind), its headers and its verified client certificate.
func (m *Middleware) call(r *http.Request) middleware.Call {
	c := middleware.Call{Method: r.URL.Path, Header: header(r.Header), Request: r}
	if m.o.method != nil {
		if name := m.o.method(r); name != "" {
			c.Method = name
		}
	}
	// RemoteAddr is the server's, "ip:port" for TCP; anything else (a
	// Unix socket's, a test's) leaves the caller without an address.
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		c.Addr = ap.Addr()
	}
	if t := r.TLS; t != nil && len(t.VerifiedChains) > 0 && len(t.VerifiedChains[0]) > 0 {
		c.Cert = t.VerifiedChains[0][0]
	}
	return c
}

// header reads an http.Header by the lower-case names the Limiter asks
// for. http.Header's Values would canonicalize each name into a new
// string; this builds the canonical name on the stack.
type header http.Header

func (h header) Values(key string) []string {
	var buf [64]byte
	if len(key) > len(buf) {
		return http.Header(h).Values(key)
	}
	upper := true
	for i := 0; i < len(key); i++ {
		c := key[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		buf[i] = c
		upper = c == '-'
	}
	return h[string(buf[:len(key)])]
}
