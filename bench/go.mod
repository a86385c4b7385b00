module github.com/floodgate-go/floodgate/bench

go 1.26.0

replace github.com/floodgate-go/floodgate => ../

require (
	github.com/floodgate-go/floodgate v0.0.0-00010101000000-000000000000
	github.com/sethvargo/go-limiter v0.7.1
	golang.org/x/time v0.16.0
)
