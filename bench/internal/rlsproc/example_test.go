package rlsproc_test

import (
	"fmt"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
)

func ExampleRatelimitEnv() {
	env := rlsproc.RatelimitEnv("/run/rl", "ratelimit", "127.0.0.1:6379", "127.0.0.1:8081", "127.0.0.1:8080", "127.0.0.1:6070")
	for _, kv := range env {
		fmt.Println(kv)
	}
	// Output:
	// USE_STATSD=false
	// LOG_LEVEL=warn
	// RUNTIME_ROOT=/run/rl
	// RUNTIME_SUBDIRECTORY=ratelimit
	// RUNTIME_WATCH_ROOT=false
	// REDIS_SOCKET_TYPE=tcp
	// REDIS_URL=127.0.0.1:6379
	// HOST=127.0.0.1
	// PORT=8080
	// GRPC_HOST=127.0.0.1
	// GRPC_PORT=8081
	// DEBUG_HOST=127.0.0.1
	// DEBUG_PORT=6070
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true
}
