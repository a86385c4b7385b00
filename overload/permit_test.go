package overload

import (
	"testing"
	"testing/synctest"
	"time"
)

// A Permit tells how long its call waited for the slot: from the call's
// arrival in the queue to the slot's release by the call before it.
func TestPermitWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithQueueTarget(time.Hour))
		held, err := c.Acquire(t.Context(), Flow{Key: "a"})
		if err != nil {
			t.Fatal(err)
		}
		if got := held.Wait(); got != 0 {
			t.Errorf("Wait() of a call admitted at once = %v, want 0", got)
		}
		ch := acquireAsync(t.Context(), c, Flow{Key: "b"})
		synctest.Wait()
		time.Sleep(30 * ms) // the synctest bubble's clock: no real wait
		held.Done()
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.p.Done()
		if got, want := r.p.Wait(), 30*ms; got != want {
			t.Errorf("Wait() of a call that waited = %v, want %v", got, want)
		}
		if got := (Permit{}).Wait(); got != 0 {
			t.Errorf("Wait() of the zero Permit = %v, want 0", got)
		}
	})
}
