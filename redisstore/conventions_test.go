package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate/internal/optiontest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// TestOptionConvention checks the option convention of
// floodgate.ErrInvalidOption on New, which makes no call to Redis.
func TestOptionConvention(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	optiontest.Check(t, func(opts ...redisstore.Option) error {
		_, err := redisstore.New(c, opts...)
		return err
	}, []optiontest.Case[redisstore.Option]{
		{Option: "WithPrefix", Bad: redisstore.WithPrefix("a{b"), Good: redisstore.WithPrefix("rl")},
		{Option: "WithName", Bad: redisstore.WithName(""), Good: redisstore.WithName("push")},
		{Option: "WithDeadline", Bad: redisstore.WithDeadline(0), Good: redisstore.WithDeadline(time.Second)},
		{Option: "WithFailurePolicy", Bad: redisstore.WithFailurePolicy(9), Good: redisstore.WithFailurePolicy(redisstore.Closed)},
		{Option: "WithLocalDivisor", Bad: redisstore.WithLocalDivisor(0.5), Good: redisstore.WithLocalDivisor(3)},
		{Option: "WithBreaker", Bad: redisstore.WithBreaker(0, time.Second), Good: redisstore.WithBreaker(3, time.Second)},
		{Option: "WithBatching", Bad: redisstore.WithBatching(-1), Good: redisstore.WithBatching(16)},
		{Option: "WithDenyCache", Bad: redisstore.WithDenyCache(-1), Good: redisstore.WithDenyCache(16)},
		{Option: "WithLeases", Bad: redisstore.WithLeases(time.Second, 0), Good: redisstore.WithLeases(time.Second, 16)},
	})
}
