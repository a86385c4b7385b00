package keyed

import "errors"

// ErrNegativeN is returned by TakeN and WaitN for n < 0.
var ErrNegativeN = errors.New("keyed: n must not be negative")
