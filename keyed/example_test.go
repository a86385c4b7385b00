package keyed_test

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
)

func Example() {
	m, err := keyed.New(keyed.WithCapacity(10_000))
	if err != nil {
		panic(err)
	}
	lim := floodgate.PerSecond(5, 2) // 5 requests/s, bursts of 2
	for i := 0; i < 3; i++ {
		res, _ := m.TakeN(context.Background(), "client-42", lim, 1)
		fmt.Println(res.Allowed, res.Remaining)
	}
	// Output:
	// true 1
	// true 0
	// false 0
}

func ExampleMap_TakeAt() {
	m, _ := keyed.New()
	lim := floodgate.PerSecond(10, 1)
	start := time.Now()
	res, _ := m.TakeAt("k", lim, 1, start)
	fmt.Println(res.Allowed)
	res, _ = m.TakeAt("k", lim, 1, start)
	fmt.Println(res.Allowed, res.RetryAfter)
	res, _ = m.TakeAt("k", lim, 1, start.Add(res.RetryAfter))
	fmt.Println(res.Allowed)
	// Output:
	// true
	// false 100ms
	// true
}

func ExampleMap_WaitN() {
	m, _ := keyed.New()
	lim := floodgate.Every(time.Millisecond, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if err := m.WaitN(ctx, "upstream", lim, 1); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(m.WaitN(ctx, "upstream", lim, 2))
	// Output:
	// floodgate: n exceeds the limit's burst
}

func ExampleMap_ReserveN() {
	m, _ := keyed.New()
	lim := floodgate.Limit{Rate: 1, Burst: 10, Debt: 5} // at most 5 tokens owed
	ctx := context.Background()
	r, _ := m.ReserveN(ctx, "job", lim, 4)
	res, err := r.Settle(ctx, 25) // 21 more than reserved: 6 + 5 fit
	fmt.Println(res.Owed, err)
	_, err = r.Settle(ctx, 25)
	fmt.Println(err)
	// Output:
	// 5 floodgate: charge exceeds the debt limit: 10 tokens not charged
	// floodgate: reservation already settled
}
