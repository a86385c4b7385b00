package floodgate_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
)

// failing is a Store that cannot decide.
type failing struct{}

var errDown = errors.New("store down")

func (failing) TakeN(context.Context, string, floodgate.Limit, int) (floodgate.Result, error) {
	return floodgate.Result{}, errDown
}

func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := keyed.New()
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		lim := floodgate.PerSecond(4, 1)
		start := time.Now()
		for i := 0; i < 3; i++ {
			if err := floodgate.Wait(ctx, m, "k", lim, 1); err != nil {
				t.Fatalf("Wait %d: %v", i, err)
			}
		}
		// Two refills of 250 ms, each stretched by at most a tenth.
		if got := time.Since(start); got < 500*time.Millisecond || got > 550*time.Millisecond {
			t.Errorf("three waits at 4/s, burst 1, took %v, want 500ms to 550ms", got)
		}

		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if err := floodgate.Wait(short, m, "k", lim, 1); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
			t.Errorf("Wait with 100ms left for a 250ms refill = %v, want ErrWouldExceedDeadline", err)
		}
		if err := floodgate.Wait(ctx, m, "k", lim, 2); !errors.Is(err, floodgate.ErrExceedsBurst) {
			t.Errorf("Wait(n > burst) = %v, want ErrExceedsBurst", err)
		}
		// The store says the same for the same take, as Store requires.
		if res, err := m.TakeN(ctx, "k", lim, 2); !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed || res.RetryAfter != floodgate.Never {
			t.Errorf("TakeN(n > burst) = %+v, %v, want refused for good with ErrExceedsBurst", res, err)
		}
		// The zero Limit admits nothing, by design rather than by mistake.
		for name, w := range map[string]func() error{
			"floodgate.Wait": func() error { return floodgate.Wait(ctx, m, "none", floodgate.Limit{}, 1) },
			"keyed.WaitN":    func() error { return m.WaitN(ctx, "none", floodgate.Limit{}, 1) },
		} {
			if err := w(); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
				t.Errorf("%s under the zero Limit = %v, want ErrWouldExceedDeadline", name, err)
			}
		}
		// A zero rate never refills a short bucket: as keyed.Map.WaitN says.
		zero := floodgate.PerSecond(0, 1)
		if err := floodgate.Wait(ctx, m, "z", zero, 1); err != nil {
			t.Fatalf("Wait on a full bucket at rate 0 = %v", err)
		}
		for name, w := range map[string]func() error{
			"floodgate.Wait": func() error { return floodgate.Wait(ctx, m, "z", zero, 1) },
			"keyed.WaitN":    func() error { return m.WaitN(ctx, "z", zero, 1) },
		} {
			if err := w(); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
				t.Errorf("%s on an empty bucket at rate 0 = %v, want ErrWouldExceedDeadline", name, err)
			}
		}
		if err := floodgate.Wait(ctx, failing{}, "k", lim, 1); !errors.Is(err, errDown) {
			t.Errorf("Wait on a failing store = %v, want its error", err)
		}
		if err := floodgate.Wait(ctx, failing{}, "k", floodgate.Inf, 1<<40); !errors.Is(err, errDown) {
			t.Errorf("Wait(Inf) on a failing store = %v, want its error", err)
		}

		cctx, ccancel := context.WithCancel(ctx)
		errc := make(chan error)
		go func() { errc <- floodgate.Wait(cctx, m, "k", lim, 1) }()
		synctest.Wait()
		ccancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Wait after cancel = %v, want context.Canceled", err)
		}
	})
}

// takeOnly hides keyed.Map's WaitN, so that Wait cannot reserve.
type takeOnly struct{ floodgate.Store }

// ctxStore refuses takes once the context is done, as redisstore does.
type ctxStore struct{ floodgate.Store }

func (s ctxStore) TakeN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	if err := ctx.Err(); err != nil {
		return floodgate.Result{}, err
	}
	return s.Store.TakeN(ctx, key, lim, n)
}

// TestWaitJitterWithinDeadline: a wait that fits the deadline succeeds; the
// jitter added to spread retries must not carry it past the deadline, nor
// up to it, where a store that checks the context refuses.
func TestWaitJitterWithinDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := keyed.New()
		s := ctxStore{takeOnly{m}}
		lim := floodgate.PerSecond(10, 1)
		for i := range 20 {
			key := "k" + string(rune('a'+i))
			m.TakeN(context.Background(), key, lim, 1) // next token in 100 ms
			ctx, cancel := context.WithTimeout(context.Background(), 102*time.Millisecond)
			if err := floodgate.Wait(ctx, s, key, lim, 1); err != nil {
				t.Errorf("wait %d for a token due 2ms before the deadline: %v", i, err)
			}
			cancel()
		}
	})
}
