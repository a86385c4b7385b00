package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

// shared is one standalone server for the tests that do not kill or hang
// it; each test uses its own key prefix.
var (
	sharedOnce sync.Once
	shared     *redistest.Server
	sharedErr  error
)

func TestMain(m *testing.M) {
	// A fuzz worker talks to its coordinator on fds 3 and 4: a
	// redis-server started here must not inherit them, or a worker's
	// death goes unreported while the server holds the pipes open.
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if code == 0 {
		// go-redis redials a pool that failed PoolSize dials from a goroutine
		// that sleeps 1 s between tries and ends only when it next wakes up.
		// Calls on a hung server may still be waiting out the client's
		// read timeout (3 s by default) when the last test returns, and the
		// stores' shared deadline timers fire up to a deadline later; each
		// Find retries for about half a second, so allow several.
		var err error
		for range 12 {
			if err = goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err == nil {
				break
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedServer returns the shared server, skipping t when redis-server is
// not installed.
func sharedServer(t testing.TB) *redistest.Server {
	t.Helper()
	if !redistest.Installed() {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
	sharedOnce.Do(func() { shared, sharedErr = redistest.Launch() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// newClient returns a client configured as the package recommends: context
// deadlines honoured, no retries. It is closed in t.Cleanup.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialTimeout:           200 * time.Millisecond,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

var prefixes atomic.Int64

// prefix returns a key prefix no other test uses.
func prefix(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("t%d_%s", prefixes.Add(1), name)
}

func newStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	// A long deadline: these tests check semantics, and a loaded machine
	// under the race detector can take tens of ms to dial. Options given
	// later replace it.
	opts = append([]redisstore.Option{redisstore.WithPrefix(prefix(t)), redisstore.WithDeadline(5 * time.Second)}, opts...)
	s, err := redisstore.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newFakeClock() *fakeClock { return fakeclock.New(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)) }

var bg = context.Background()
