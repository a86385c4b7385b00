package completionv1_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	completionv1 "github.com/floodgate-go/floodgate/proto/completion/v1"
)

// The method's name and kind are part of the example's contract: its tenant
// config names the method, and the interceptors treat streams differently
// from unary calls. A regeneration that changed them should fail here
// rather than in the example.
func TestServiceShape(t *testing.T) {
	fd := completionv1.File_completion_v1_completion_proto
	if got, want := fd.Path(), "completion/v1/completion.proto"; got != want {
		t.Errorf("Path() = %q, want %q", got, want)
	}
	svc := fd.Services().ByName("Completion")
	if svc == nil {
		t.Fatal("no Completion service in the descriptor")
	}
	type method struct {
		FullName        string
		ClientStreaming bool
		ServerStreaming bool
	}
	var got []method
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		got = append(got, method{
			FullName:        "/" + string(svc.FullName()) + "/" + string(m.Name()),
			ClientStreaming: m.IsStreamingClient(),
			ServerStreaming: m.IsStreamingServer(),
		})
	}
	want := []method{{FullName: "/completion.v1.Completion/Complete", ServerStreaming: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("methods (-want +got):\n%s", diff)
	}
	if got, want := completionv1.Completion_Complete_FullMethodName, "/completion.v1.Completion/Complete"; got != want {
		t.Errorf("Completion_Complete_FullMethodName = %q, want %q", got, want)
	}
}
