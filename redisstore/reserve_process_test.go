package redisstore_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// The environment of a child process of TestReserveProcessDies.
const (
	childRole    = "FLOODGATE_RESERVE_CHILD" // worker or victim
	childAddrs   = "FLOODGATE_RESERVE_ADDRS" // comma-separated
	childCluster = "FLOODGATE_RESERVE_CLUSTER"
	childPrefix  = "FLOODGATE_RESERVE_PREFIX"
	childSeed    = "FLOODGATE_RESERVE_SEED"
)

// The shared bucket: no refill, so that its tokens at the end are exact
// arithmetic, and a debt limit that long calls reach.
var (
	processLimit = floodgate.Limit{Rate: 0, Burst: 1000, Debt: 100}
	processKey   = "shared"
)

const (
	estimate    = 5
	workerPairs = 300 // reservations each worker makes and settles
	victimPairs = 20  // the victim settles these, then holds victimHeld
	victimHeld  = 10
)

// TestReserveProcessDies: four processes share one bucket, each with its
// own store and connections. Three reserve and settle (the actual cost
// from 0 to twice the estimate, and for one call in ten more than the
// bucket and its debt limit, so that the bucket goes into debt, hits its
// debt limit and refuses); the
// fourth settles some reservations, then
// holds others and is killed (SIGKILL) while the others run. The bucket
// ends exactly at its burst less what every settle charged and the
// estimates the dead process held: they stay charged, erring toward the
// limit; and it never owes more than its debt limit.
func TestReserveProcessDies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and a Cluster")
	}
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Start(t)
		processRun(t, []string{srv.Addr}, false)
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		processRun(t, cl.Addrs, true)
	})
}

func processRun(t *testing.T, addrs []string, cluster bool) {
	pre := prefix(t)
	start := func(role string, seed int) (*exec.Cmd, *bufio.Reader) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReserveChildHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), childRole+"="+role, childAddrs+"="+strings.Join(addrs, ","),
			childCluster+"="+strconv.FormatBool(cluster), childPrefix+"="+pre, childSeed+"="+strconv.Itoa(seed))
		cmd.Stderr = os.Stderr
		if _, err := cmd.StdinPipe(); err != nil { // the victim blocks on it
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewReader(out)
	}
	// The victim first, so that it holds tokens before the bucket runs dry.
	victim, vout := start("victim", 0)
	var victimCharged, held int
	for {
		line, err := vout.ReadString('\n')
		if err != nil {
			victim.Process.Kill()
			victim.Wait()
			t.Fatalf("the victim ended before it held its reservations: %v", err)
		}
		if n, _ := fmt.Sscanf(line, "holding charged=%d held=%d", &victimCharged, &held); n == 2 {
			break
		}
	}
	if held != victimHeld*estimate {
		t.Fatalf("the victim holds %d tokens, want %d", held, victimHeld*estimate)
	}
	type worker struct {
		cmd *exec.Cmd
		out *bufio.Reader
	}
	var workers []worker
	for i := range 3 {
		cmd, out := start("worker", i+1)
		workers = append(workers, worker{cmd, out})
	}
	// Killed while the workers run, holding its reservations.
	if err := victim.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	victim.Wait()

	charged, uncharged := victimCharged, 0
	for i, w := range workers {
		var out bytes.Buffer
		out.ReadFrom(w.out)
		if err := w.cmd.Wait(); err != nil {
			t.Fatalf("worker %d: %v\n%s", i, err, out.Bytes())
		}
		var c, u int
		if n, _ := fmt.Sscanf(resultLine(out.String()), "result charged=%d uncharged=%d", &c, &u); n != 2 {
			t.Fatalf("worker %d printed no result:\n%s", i, out.Bytes())
		}
		charged += c
		uncharged += u
	}
	s := newStore(t, connect(t, addrs, cluster), redisstore.WithPrefix(pre))
	res, err := s.Peek(bg, processKey, processLimit)
	if err != nil {
		t.Fatal(err)
	}
	got := res.Remaining - res.Owed
	if want := processLimit.Burst - charged - held; got != want {
		t.Errorf("the bucket holds %d tokens, want burst − charged − held = %d − %d − %d = %d",
			got, processLimit.Burst, charged, held, want)
	}
	if got < -processLimit.DebtLimit() {
		t.Errorf("the bucket owes %d tokens, more than its debt limit %d", -got, processLimit.DebtLimit())
	}
	if uncharged == 0 {
		t.Errorf("no settle reached the debt limit: the run tests nothing of it")
	}
	t.Logf("charged %d, held by the dead process %d, not charged %d; the bucket holds %d", charged, held, uncharged, got)
}

// resultLine returns the line of out that holds a worker's result.
func resultLine(out string) string {
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "result ") {
			return line
		}
	}
	return ""
}

func connect(t testing.TB, addrs []string, cluster bool) redis.UniversalClient {
	t.Helper()
	if !cluster {
		return newClient(t, addrs[0])
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestReserveChildHelper is a child process of TestReserveProcessDies.
func TestReserveChildHelper(t *testing.T) {
	role := os.Getenv(childRole)
	if role == "" {
		t.Skip("runs only as a child of TestReserveProcessDies")
	}
	cluster, _ := strconv.ParseBool(os.Getenv(childCluster))
	seed, _ := strconv.Atoi(os.Getenv(childSeed))
	c := connect(t, strings.Split(os.Getenv(childAddrs), ","), cluster)
	// A long deadline, and no local decisions: every decision is Redis's.
	s, err := redisstore.New(c, redisstore.WithPrefix(os.Getenv(childPrefix)),
		redisstore.WithDeadline(10*time.Second), redisstore.WithFailurePolicy(redisstore.Closed))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	pairs := workerPairs
	if role == "victim" {
		pairs = victimPairs
	}
	charged, uncharged := 0, 0
	for range pairs {
		r, err := s.ReserveN(bg, processKey, processLimit, estimate)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Result.Allowed {
			if r.Result.Source != floodgate.SourceRedis {
				t.Fatalf("refused by %v, not Redis", r.Result.Source)
			}
			continue
		}
		actual := rng.IntN(2*estimate + 1)
		if role == "worker" && rng.IntN(10) == 0 {
			actual = 1200 // a long call: more than the bucket and its debt limit
		}
		_, err = r.Settle(bg, actual)
		left := 0
		var dle *floodgate.DebtLimitError
		switch {
		case errors.As(err, &dle):
			left = dle.Uncharged
		case err != nil:
			t.Fatal(err)
		}
		charged += actual - left
		uncharged += left
	}
	if role == "victim" {
		held := 0
		for range victimHeld {
			r, err := s.ReserveN(bg, processKey, processLimit, estimate)
			if err != nil || !r.Result.Allowed {
				t.Fatalf("the victim's reservation: %+v, %v", r.Result, err)
			}
			held += r.Tokens()
		}
		fmt.Printf("holding charged=%d held=%d\n", charged, held)
		os.Stdout.Sync()
		// Until killed: the parent never writes to, nor closes, stdin.
		bufio.NewReader(os.Stdin).ReadString('\n')
		t.Fatal("the victim was not killed")
	}
	fmt.Printf("result charged=%d uncharged=%d\n", charged, uncharged)
	os.Exit(0) // no leak check: the process ends here
}
