module github.com/floodgate-go/floodgate/redisstore

go 1.26.0

replace github.com/floodgate-go/floodgate => ../

require (
	github.com/floodgate-go/floodgate v0.0.0-00010101000000-000000000000
	github.com/google/go-cmp v0.7.0
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
