package main

import (
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	completionv1 "github.com/floodgate-go/floodgate/proto/completion/v1"
)

// The calls' shape: a reply of 200 to 4,000 tokens, 1,000 on average,
// streamed in 0.1 to 1 s.
const (
	minReply  = 200
	maxReply  = 4000
	meanReply = 1000
	// replySkew is k in 200 + 3800·u^k, u uniform in [0, 1): the mean is
	// 200 + 3800/(k+1), which is 1,000 for k = 3.75. Short replies are
	// common and long ones rare, as with a model's.
	replySkew = float64(maxReply-minReply)/(meanReply-minReply) - 1

	minLasts = 100 * time.Millisecond
	maxLasts = time.Second
	// chunkEvery is how often the model sends what it has generated.
	chunkEvery = 50 * time.Millisecond
)

// drawReply draws a reply's length in tokens.
func drawReply(r *rand.Rand) int {
	return minReply + int(float64(maxReply-minReply)*math.Pow(r.Float64(), replySkew))
}

// lasts returns how long a reply of n tokens streams: 100 ms for 200
// tokens, 1 s for 4,000, in proportion between, and within those bounds
// beyond them.
func lasts(n int) time.Duration {
	n = min(max(n, minReply), maxReply)
	return minLasts + time.Duration(float64(maxLasts-minLasts)*float64(n-minReply)/float64(maxReply-minReply))
}

// model is the Completion service: a simulated model that streams a reply
// of the length it is asked for, in chunks every chunkEvery on its clock,
// and reports the tokens it sent as the call's cost once the stream is
// over, as a model behind it would say in the usage of its last message.
type model struct {
	completionv1.UnimplementedCompletionServer
	clock clock
}

func (m *model) Complete(req *completionv1.CompleteRequest, stream grpc.ServerStreamingServer[completionv1.CompleteResponse]) error {
	n := int(req.GetReplyTokens())
	if n < 1 {
		return status.Error(codes.InvalidArgument, "reply_tokens must be at least 1")
	}
	ctx := stream.Context()
	d, start := lasts(n), m.clock.Now()
	sent := 0
	// What was sent is what the call cost, whether or not it got to the
	// end: known once the stream is over.
	defer func() { reportCost(ctx, sent) }()
	for sent < n {
		if m.clock.Sleep(ctx, chunkEvery); ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		due := n
		if el := m.clock.Now().Sub(start); el < d {
			due = int(int64(n) * int64(el) / int64(d))
		}
		if due == sent {
			continue
		}
		k := due - sent
		if err := stream.Send(&completionv1.CompleteResponse{Text: words(k), Tokens: int32(k)}); err != nil {
			return err
		}
		sent = due
	}
	return stream.Send(&completionv1.CompleteResponse{Usage: &completionv1.Usage{CompletionTokens: int32(n)}})
}

// words returns a text of n tokens.
func words(n int) string { return strings.Repeat("lorem ", n) }
