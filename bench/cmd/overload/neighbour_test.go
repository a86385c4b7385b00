package main

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

func TestNeighbourArgv(t *testing.T) {
	exe := []string{"/x/overload"}
	argv, pinned, cgroup := neighbourArgv(&Isolation{}, exe, 3, 45*time.Second)
	if want := []string{"/x/overload", "neighbour", "-workers", "3", "-max", "45s"}; !slices.Equal(argv, want) || pinned != "" || cgroup != "" {
		t.Errorf("unisolated: %q %q %q, want %q", argv, pinned, cgroup, want)
	}
	iso := &Isolation{Taskset: "/usr/bin/taskset", ServerCPU: 0, LoadCPU: 1, LoadCgroup: "/sys/fs/cgroup/cpu/x-load", CgroupCPU: "/sys/fs/cgroup/cpu/x"}
	argv, pinned, cgroup = neighbourArgv(iso, exe, 4, time.Minute)
	// Pinned to the server's CPU, moved to the root cpu cgroup, never
	// into the server's.
	if pinned != "0" || cgroup != rootCPUCgroup {
		t.Errorf("pinned %q cgroup %q, want 0 and %s", pinned, cgroup, rootCPUCgroup)
	}
	if !slices.Contains(argv, "/usr/bin/taskset") || slices.Contains(argv, iso.CgroupCPU) || argv[len(argv)-5] != "neighbour" {
		t.Errorf("isolated argv %q", argv)
	}
	if i := slices.Index(argv, "/usr/bin/taskset"); i < 0 || argv[i+1] != "-c" || argv[i+2] != "0" {
		t.Errorf("isolated argv %q: not pinned to CPU 0", argv)
	}
}

// TestNeighbourLifecycle starts real neighbours (this test binary, see
// TestMain): one is stopped, one stops by itself.
func TestNeighbourLifecycle(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	n, err := startNeighbour(ctx, &Isolation{}, []string{exe}, 2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !n.running() {
		t.Fatal("the neighbour stopped by itself long before its -max")
	}
	st := n.stop()
	if n.running() {
		t.Fatal("the neighbour still runs after stop")
	}
	if !st.Killed || st.Workers != 2 || st.Secs < 0.3 || st.Secs > 10 {
		t.Errorf("stopped neighbour: %+v", st)
	}
	if st.CPU <= 0.05 {
		t.Errorf("the neighbour burnt %.3f CPU, want some", st.CPU)
	}
	if again := n.stop(); again != st {
		t.Errorf("a second stop changed the figures: %+v then %+v", st, again)
	}

	short, err := startNeighbour(ctx, &Isolation{}, []string{exe}, 1, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-short.done:
	case <-time.After(5 * time.Second):
		short.stop()
		t.Fatal("a neighbour with -max 200ms still ran after 5s")
	}
	if st := short.stop(); st.Killed || st.Secs > 3 {
		t.Errorf("self-stopped neighbour: %+v", st)
	}
}
