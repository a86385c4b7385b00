package floodgate_test

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
)

// A quota of model tokens, whose cost is known only once the reply is
// written: reserve an estimate, settle the actual.
func ExampleReservation() {
	m, _ := keyed.New()
	// 1000 tokens a minute, in bursts of 1000; a reply may overrun its
	// estimate into debt of up to one burst (the default debt limit).
	lim := floodgate.Every(60*time.Millisecond, 1000)
	ctx := context.Background()

	r, _ := m.ReserveN(ctx, "tenant-a", lim, 200) // the estimate
	fmt.Println(r.Result.Allowed, r.Result.Remaining)
	res, _ := r.Settle(ctx, 50) // the reply cost 50: 150 come back
	fmt.Println(res.Remaining)

	r, _ = m.ReserveN(ctx, "tenant-a", lim, 200)
	res, _ = r.Settle(ctx, 1500) // a long reply: 1300 more, 550 into debt
	fmt.Println(res.Remaining, res.Owed)

	// Every take is refused until the debt is repaid.
	res, _ = m.TakeN(ctx, "tenant-a", lim, 1)
	fmt.Println(res.Allowed, res.Owed, res.RetryAfter.Round(time.Second))
	// Output:
	// true 800
	// 950
	// 0 550
	// false 550 33s
}
