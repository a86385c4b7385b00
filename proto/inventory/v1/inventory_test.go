package inventoryv1_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// The method names and kinds are part of the examples' contract: tenant
// configs in testdata/ name the methods, and the interceptors treat streams
// differently from unary calls. A regeneration that changed them should fail
// here rather than in a demo.
func TestServiceShape(t *testing.T) {
	fd := inventoryv1.File_inventory_v1_inventory_proto
	if got, want := fd.Path(), "inventory/v1/inventory.proto"; got != want {
		t.Errorf("Path() = %q, want %q", got, want)
	}
	svc := fd.Services().ByName("Inventory")
	if svc == nil {
		t.Fatal("no Inventory service in the descriptor")
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
	want := []method{
		{FullName: inventoryv1.Inventory_Allocate_FullMethodName},
		{FullName: inventoryv1.Inventory_GetStock_FullMethodName},
		{FullName: inventoryv1.Inventory_WatchStock_FullMethodName, ServerStreaming: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("methods (-want +got):\n%s", diff)
	}
	if got, want := inventoryv1.Inventory_Allocate_FullMethodName, "/inventory.v1.Inventory/Allocate"; got != want {
		t.Errorf("Inventory_Allocate_FullMethodName = %q, want %q", got, want)
	}
}
