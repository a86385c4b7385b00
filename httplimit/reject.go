package httplimit

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// reject answers a request the Limiter turned away, with err, its status,
// in the protocol the request speaks.
func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, a *middleware.Admission, err error) {
	d, decided := a.Decision()
	// The Limiter's rejections are shared, one per retry delay on its
	// grid, and so are their bodies. An ended context's status is not.
	b := m.bodiesOf(err, decided && !d.Allowed)
	code := http.StatusServiceUnavailable
	switch {
	case !decided:
	case d.Reason == middleware.ReasonQuota, d.Reason == middleware.ReasonDebt:
		code = http.StatusTooManyRequests
	case d.Reason == middleware.ReasonInvalidEstimate:
		code = http.StatusBadRequest
	}
	var rl *middleware.Decision
	if m.o.rateHeaders && decided {
		rl = &d
	}
	m.answer(w, r, b, code, a.RetryAfter(), rl)
}

// refuse answers a metered request whose first Write the Limiter refused a
// chunk, with err, the chunk's rejection, before anything of the response
// went out. The admission allowed the request, so the answer is read from
// err's status; the RateLimit fields set at admission stay.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	b := m.bodiesOf(err, true) // a chunk's rejections are shared too
	h := w.Header()
	// The handler's description of the response it meant to write.
	delete(h, "Content-Length")
	delete(h, "Content-Encoding")
	m.answer(w, r, b, b.code, b.retry, nil)
}

// bodiesOf returns the bodies of err, kept built when shared.
func (m *Middleware) bodiesOf(err error, shared bool) *bodies {
	if shared {
		if b, ok := m.bodies.Get(err); ok {
			return b
		}
	}
	b := build(err)
	if shared {
		m.bodies.Add(err, b)
	}
	return b
}

// answer writes the rejection b in the protocol r speaks: code, with
// Retry-After for ra > 0 and, for d non-nil, d's RateLimit fields, where
// the protocol does not carry the status in a 200.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, b *bodies, code int, ra time.Duration, d *middleware.Decision) {
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

// bodies are the answers to one rejection, in each protocol.
type bodies struct {
	// status is the google.rpc.Status as JSON, which grpc-gateway clients
	// parse; connect is Connect's error JSON, and connectEnd its
	// end-of-stream message.
	status, connect, connectEnd []byte
	// The gRPC status headers.
	grpcStatus, grpcMessage, grpcDetails string
	// code and retry answer a refused chunk (refuse), read from the
	// status: its HTTP status and the RetryInfo delay, or 0.
	code  int
	retry time.Duration
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

func build(err error) *bodies {
	st := status.Convert(err)
	p := st.Proto()
	b := &bodies{grpcStatus: strconv.Itoa(int(st.Code())), grpcMessage: percentEncode(st.Message())}
	b.code, b.retry = answerOf(st)
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

// answerOf returns the HTTP status and the retry delay of a rejection
// the admission did not decide (a refused chunk): 429 for the quota or a
// debt, 400 for an invalid estimate, else 503, by the ErrorInfo reason, or
// without details by the default codes (RESOURCE_EXHAUSTED for the quota,
// see middleware.WithCodes); the delay is RetryInfo's.
func answerOf(st *status.Status) (int, time.Duration) {
	code, reason := http.StatusServiceUnavailable, ""
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	switch {
	case reason == middleware.ErrorReasonRateLimited, reason == middleware.ErrorReasonInDebt,
		reason == "" && st.Code() == codes.ResourceExhausted:
		code = http.StatusTooManyRequests
	case reason == middleware.ErrorReasonInvalidEstimate, reason == "" && st.Code() == codes.InvalidArgument:
		code = http.StatusBadRequest
	}
	return code, retry
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
	if d.Reason == middleware.ReasonStoreError || d.Reason == middleware.ReasonInvalidEstimate || rule.Limit.IsInf() || rule.Cost < 1 {
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
