package main

import (
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// provider is a fake push provider (think FCM or APNs): an HTTP server on
// loopback that accepts at most rate requests per second, with a small
// burst, and answers 429 Too Many Requests above that, as the real ones do.
type provider struct {
	rate  float64
	burst float64

	mu       sync.Mutex
	tokens   float64
	last     time.Time
	accepted int
	rejected int
	first    time.Time // first and last accepted request
	latest   time.Time

	srv *http.Server
	url string
}

func startProvider(rate float64, burst int) (*provider, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &provider{rate: rate, burst: float64(burst), tokens: float64(burst)}
	p.url = "http://" + l.Addr().String() + "/send"
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go p.srv.Serve(l)
	return p, nil
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	now := time.Now()
	p.mu.Lock()
	if !p.last.IsZero() {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	}
	p.last = now
	ok := p.tokens >= 1
	if ok {
		p.tokens--
		p.accepted++
		if p.first.IsZero() {
			p.first = now
		}
		p.latest = now
	} else {
		p.rejected++
	}
	p.mu.Unlock()
	if !ok {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "quota exceeded", http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// observed returns the accepted count, the 429 count and the accepted rate
// between the first and the last accepted request.
func (p *provider) observed() (accepted, rejected int, rate float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.latest.Sub(p.first).Seconds(); p.accepted > 1 && d > 0 {
		rate = float64(p.accepted-1) / d
	}
	return p.accepted, p.rejected, rate
}

func (p *provider) close() { p.srv.Close() }
