package main

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// The replicas variant's redis-server, started on loopback for the first
// run that needs it and stopped by stopRedis.
var (
	redisOnce sync.Once
	redisSrv  *redistest.Server
	redisErr  error
	runs      atomic.Int64 // numbers each run's key prefix
)

// replicaStore returns a store on the experiment's redis-server, on clock,
// with a key prefix of its own (the replicas of one run share it), and a
// function that closes it and its client.
func replicaStore(clock *fakeClock) (*redisstore.Store, func(), error) {
	redisOnce.Do(func() {
		if !redistest.Installed() {
			redisErr = errors.New("redis-server is not installed; install it with: apt-get install -y redis-server")
			return
		}
		redisSrv, redisErr = redistest.Launch()
	})
	if redisErr != nil {
		return nil, nil, fmt.Errorf("replicas: %w", redisErr)
	}
	c := redis.NewClient(&redis.Options{Addr: redisSrv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	st, err := redisstore.New(c, redisstore.WithPrefix(fmt.Sprint("rlqs-bench-", runs.Add(1))), redisstore.WithClientClock(clock))
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return st, func() { st.Close(); c.Close() }, nil
}

// stopRedis stops the experiment's redis-server, if it started one.
func stopRedis() {
	if redisSrv != nil {
		redisSrv.Close()
	}
}
