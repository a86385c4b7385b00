package overload_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload"
)

// A controller in front of a handler: Enter where the call enters the
// server (before its request is read: a gRPC tap handle, the top of an
// HTTP handler), Acquire before the work, Done after, and a shed call
// turned into the caller's error.
func ExampleController() {
	ctrl, err := overload.New(
		overload.WithLimits(1, 1),                    // one call at a time, for the example
		overload.WithQueueTarget(time.Millisecond/2), // calls wait at most twice this
	)
	if err != nil {
		panic(err)
	}
	serve := func(ctx context.Context, tenant string) error {
		f := overload.Flow{Key: tenant, Weight: 1}
		ctx, in := ctrl.Enter(ctx, f)
		if !in {
			return errors.New("overloaded") // shed before any work
		}
		p, err := ctrl.Acquire(ctx, f)
		if err != nil {
			return err // *overload.ShedError, or ctx's error
		}
		defer p.Done()
		return nil // the handler's work
	}

	// A call of acme holds the only slot...
	ctx, _ := ctrl.Enter(context.Background(), overload.Flow{Key: "acme"})
	busy, err := ctrl.Acquire(ctx, overload.Flow{Key: "acme"})
	if err != nil {
		panic(err)
	}
	// ...so globex's call waits its millisecond and is shed.
	err = serve(context.Background(), "globex")
	var shed *overload.ShedError
	if errors.As(err, &shed) {
		fmt.Println("globex:", shed.Cause, "retry after", shed.RetryAfter)
	}
	busy.Done()
	fmt.Println("globex again:", serve(context.Background(), "globex"))
	fmt.Println("shed so far:", ctrl.Snapshot().ShedTotal())
	// Output:
	// globex: wait_timeout retry after 200ms
	// globex again: <nil>
	// shed so far: 1
}

// The tenant file's weights and priorities become flows; with middleware,
// WithOverload does this for every call.
func ExampleFlow() {
	prio, err := floodgate.ParsePriority("sheddable") // as a tenant file names it
	if err != nil {
		panic(err)
	}
	f := overload.Flow{Key: "t:reporting", Weight: 0.5, Priority: prio}
	fmt.Println(f.Key, f.Weight, f.Priority)
	// Output: t:reporting 0.5 sheddable
}
