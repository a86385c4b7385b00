package httplimit

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// reject answers a request the Limiter turned away with err, its
// rejection or the status of a context that ended while the request
// waited, in the protocol the request speaks.
func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, a *middleware.Admission, err error) {
	var rl *middleware.Decision
	if d, decided := a.Decision(); m.o.rateHeaders && decided {
		rl = &d
	}
	m.answer(w, r, err, rl)
}

// refuse answers a metered request whose first Write the Limiter refused a
// chunk, with err, the chunk's rejection (or the status of the request's
// ended context), before anything of the response went out. The RateLimit
// fields set at admission stay.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	h := w.Header()
	// The handler's description of the response it meant to write.
	delete(h, "Content-Length")
	delete(h, "Content-Encoding")
	m.answer(w, r, err, nil)
}

// httpStatus returns the HTTP status answering a rejection for reason k:
// the caller's own quota or debt is 429, its invalid estimate 400, and
// the server's state (overload, the CPU gate, a failed store) 503.
func httpStatus(k middleware.Reason) int {
	switch k {
	case middleware.ReasonQuota, middleware.ReasonDebt:
		return http.StatusTooManyRequests
	case middleware.ReasonInvalidEstimate:
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

// answer writes err in the protocol r speaks: the HTTP status and
// Retry-After of its Rejection (503 and none for any other error, an ended
// context's) and, for d non-nil, d's RateLimit fields, where the protocol
// does not carry the status in a 200.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, err error, d *middleware.Decision) {
	code, ra := http.StatusServiceUnavailable, time.Duration(0)
	var b *bodies
	if rej, ok := errors.AsType[*middleware.Rejection](err); ok {
		code, ra = httpStatus(rej.Reason), rej.RetryAfter
		b = m.bodiesOf(rej)
	} else {
		b = build(status.Convert(err))
	}
	h := w.Header()
	ct := r.Header.Get("Content-Type")
	if hasPrefixFold(ct, "application/grpc") {
		// gRPC and gRPC-Web: a Trailers-Only response, the status in
		// the headers of a 200 without a body, as grpc-go's server sends
		// it, so that clients read the code and the details.
		h["Content-Type"] = []string{ct}
		h["Grpc-Status"] = []string{b.grpcStatus}
		h["Grpc-Message"] = []string{b.grpcMessage}
		if b.grpcDetails != "" {
			h["Grpc-Status-Details-Bin"] = []string{b.grpcDetails}
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	if ra > 0 {
		h["Retry-After"] = []string{strconv.FormatInt(seconds(ra), 10)}
	}
	if d != nil {
		setRateLimit(h, *d)
	}
	body := b.status
	switch {
	case hasPrefixFold(ct, "application/connect+"):
		// A Connect stream ends with an end-of-stream message holding
		// the error, in a 200.
		h["Content-Type"] = []string{ct}
		code, body = http.StatusOK, b.connectEnd
	case r.Header.Get("Connect-Protocol-Version") != "" ||
		r.Method == http.MethodGet && r.URL.Query().Get("connect") == "v1":
		h["Content-Type"] = []string{"application/json"}
		body = b.connect
	default:
		h["Content-Type"] = []string{"application/json"}
	}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// bodiesOf returns the bodies of rej, kept built: the Limiter shares its
// Rejections, one per reason and retry delay on its grid, and they never
// change. An ended context's status is not shared, and not kept.
func (m *Middleware) bodiesOf(rej *middleware.Rejection) *bodies {
	if b, ok := m.bodies.Get(rej); ok {
		return b
	}
	b := build(rej.GRPCStatus())
	m.bodies.Add(rej, b)
	return b
}

// bodies are the answers to one rejection, in each protocol.
type bodies struct {
	// status is the google.rpc.Status as JSON, which grpc-gateway clients
	// parse; connect is Connect's error JSON, and connectEnd its
	// end-of-stream message.
	status, connect, connectEnd []byte
	// The gRPC status headers.
	grpcStatus, grpcMessage, grpcDetails string
}

// connectDetail is a status detail as Connect's error JSON holds it.
type connectDetail struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type connectError struct {
	Code    string          `json:"code"`
	Message string          `json:"message,omitempty"`
	Details []connectDetail `json:"details,omitempty"`
}

// build encodes st in each protocol.
func build(st *status.Status) *bodies {
	p := st.Proto()
	b := &bodies{grpcStatus: strconv.Itoa(int(st.Code())), grpcMessage: percentEncode(st.Message())}
	b.status, _ = protojson.Marshal(p)
	ce := connectError{Code: connectCode(st.Code().String()), Message: st.Message()}
	for _, d := range p.GetDetails() {
		ce.Details = append(ce.Details, connectDetail{
			Type:  strings.TrimPrefix(d.GetTypeUrl(), "type.googleapis.com/"),
			Value: base64.RawStdEncoding.EncodeToString(d.GetValue()),
		})
	}
	b.connect, _ = json.Marshal(ce)
	end, _ := json.Marshal(struct {
		Error connectError `json:"error"`
	}{ce})
	// An envelope: flags (0x02, end of stream), the length, the message.
	b.connectEnd = binary.BigEndian.AppendUint32([]byte{0x02}, uint32(len(end)))
	b.connectEnd = append(b.connectEnd, end...)
	if len(p.GetDetails()) > 0 {
		if bin, err := proto.Marshal(p); err == nil {
			b.grpcDetails = base64.RawStdEncoding.EncodeToString(bin)
		}
	}
	return b
}

// connectCode returns the Connect name of a gRPC code's name:
// "ResourceExhausted" is "resource_exhausted".
func connectCode(name string) string {
	var sb strings.Builder
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			if i > 0 {
				sb.WriteByte('_')
			}
			c += 'a' - 'A'
		}
		sb.WriteRune(c)
	}
	return sb.String()
}

// percentEncode encodes a grpc-message value: bytes outside printable
// ASCII, and '%', as %XX.
func percentEncode(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '%' {
			const hex = "0123456789ABCDEF"
			sb.WriteByte('%')
			sb.WriteByte(hex[c>>4])
			sb.WriteByte(hex[c&15])
		} else {
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// setRateLimit sets the RateLimit-Policy and RateLimit fields for d's
// rule and bucket (see the package doc), counting in calls of d's cost.
// A store error leaves no bucket to speak of, and an unlimited rule no
// quota.
func setRateLimit(h http.Header, d middleware.Decision) {
	rule, res := d.Rule, d.Result
	if d.Reason == middleware.ReasonStoreError || d.Reason == middleware.ReasonInvalidEstimate || rule.Limit.IsInf() || rule.Cost < 1 ||
		res.Limit.IsZero() { // no bucket answered: turned away as it entered the overload controller
		return
	}
	// Both fields in one string and their values in one slice: two
	// allocations a request, whatever the rule.
	var buf [192]byte
	cost := int64(rule.Cost)
	b := appendPolicyName(buf[:0], rule)
	name := len(b)
	b = strconv.AppendInt(append(b, ";q="...), int64(rule.Limit.Burst)/cost, 10)
	if rule.Limit.Rate > 0 {
		w := math.Ceil(float64(rule.Limit.Burst) / rule.Limit.Rate)
		b = strconv.AppendInt(append(b, ";w="...), int64(min(max(w, 1), maxInteger)), 10)
	}
	policy := len(b)
	b = append(b, b[:name]...)
	b = strconv.AppendInt(append(b, ";r="...), int64(res.Remaining)/cost, 10)
	b = strconv.AppendInt(append(b, ";t="...), seconds(res.ResetAfter), 10)
	fields := string(b)
	vals := make([]string, 2)
	vals[0], vals[1] = fields[:policy], fields[policy:]
	h["Ratelimit-Policy"] = vals[0:1:1]
	h["Ratelimit"] = vals[1:2:2]
}

// maxInteger is the largest Integer a structured field holds (RFC 9651).
const maxInteger = 999_999_999_999_999

// appendPolicyName appends the quota policy's name: the rule's method
// pattern ("default", "/pkg.Svc/*", …) as a structured-field String, or its
// ID if the pattern will not fit one.
func appendPolicyName(b []byte, rule tenant.Rule) []byte {
	for i := 0; i < len(rule.Pattern); i++ {
		if c := rule.Pattern[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			return append(append(append(b, '"'), rule.ID...), '"')
		}
	}
	return append(append(append(b, '"'), rule.Pattern...), '"')
}

// seconds returns d in whole seconds, rounded up, at most maxInteger.
func seconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(s, maxInteger)
}

// hasPrefixFold reports whether s begins with the lower-case prefix,
// ignoring case: media types are case-insensitive.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
