package labels

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
)

// MaxDebts is the most metered buckets a Debts follows; a bucket newly
// seen in debt beyond it takes the place of the one seen longest ago.
const MaxDebts = 4096

// DebtNames are the debt gauge's label names, in the order of DebtLabels'
// values; tenant last, only when tenants are labelled.
var DebtNames = []string{"unit", "tier", "tenant"}

// DebtValues are a debt series' label values ("" tenant when tenants are
// not labelled).
type DebtValues struct{ Unit, Tier, Tenant string }

// DebtLabels returns v in the order of DebtNames.
func (l *Labeler) DebtLabels(v DebtValues) []string {
	labels := []string{v.Unit, v.Tier}
	if l.cfg.MaxTenants > 0 {
		labels = append(labels, v.Tenant)
	}
	return labels
}

// debtKey names a metered bucket: its tenant, and its meter among the
// tenant's.
type debtKey struct{ tenant, meter string }

// A debt is one bucket's debt as last seen, in a list from the most
// recently seen to the least.
type debt struct {
	key        debtKey
	values     DebtValues
	owed, rate float64 // units owed when seen, and repaid a second
	seen       time.Time
	prev, next *debt
}

// at returns what the bucket owes at now, had nothing been charged
// since it was seen: refill repays rate units a second.
func (d *debt) at(now time.Time) float64 {
	return max(0, d.owed-d.rate*max(now.Sub(d.seen), 0).Seconds())
}

// Debts follows what tenants' metered buckets owe, from the Events that
// carry the buckets' answers (Event.Metered): an answer that owes sets
// the bucket's debt, a settle that leaves it owing nothing clears it, and
// refill repays it in between. Anonymous callers' buckets, one an
// address, are not followed. At most MaxDebts buckets are followed. It is
// safe for concurrent use.
type Debts struct {
	l     *Labeler
	clock floodgate.Clock
	n     atomic.Int64 // buckets followed, read without the lock

	mu   sync.Mutex
	m    map[debtKey]*debt
	list debt // sentinel: next is the most recently seen, prev the least
}

// NewDebts returns a Debts that labels by l and reads the time from clock.
func NewDebts(l *Labeler, clock floodgate.Clock) *Debts {
	d := &Debts{l: l, clock: clock, m: make(map[debtKey]*debt)}
	d.list.next, d.list.prev = &d.list, &d.list
	return d
}

// Observe notes the debt e reports. It allocates nothing but a bucket's
// entry as it is first seen in debt, and takes a lock only for an event
// that reports a debt, or a settle while some bucket is followed.
func (d *Debts) Observe(e middleware.Event) {
	r := e.Metered
	owes := r.Owed > 0
	// An answer that owes nothing clears the debt only when it is a
	// settle's: a refusal that owes nothing may have been made without
	// the bucket (an estimate beyond the burst), and an admission's is
	// as old as the call.
	clears := !owes && r.Allowed && e.Reason == middleware.ReasonSettled && d.n.Load() > 0
	if !owes && !clears || e.Tenant == "" || e.MeterID == "" || e.Unit == "" {
		return
	}
	k := debtKey{e.Tenant, e.MeterID}
	if clears {
		d.mu.Lock()
		if x, ok := d.m[k]; ok {
			d.drop(x)
		}
		d.mu.Unlock()
		return
	}
	now := d.clock.Now()
	v := DebtValues{Unit: d.l.units.label(e.Unit).Value, Tier: d.l.tiers.label(e.Tier).Value, Tenant: d.l.tenant(e.Tenant).Value}
	d.mu.Lock()
	defer d.mu.Unlock()
	x, ok := d.m[k]
	switch {
	case ok:
		d.unlink(x)
	case len(d.m) >= MaxDebts:
		x = d.list.prev // seen longest ago
		d.drop(x)
		fallthrough
	default:
		// Copies, so that the entry does not pin a reloaded-away table's
		// strings.
		x = &debt{key: debtKey{strings.Clone(e.Tenant), strings.Clone(e.MeterID)}}
		d.m[x.key] = x
		d.n.Add(1)
	}
	x.values, x.owed, x.rate, x.seen = v, float64(r.Owed), r.Limit.Rate, now
	d.pushFront(x)
}

// Each calls f, outside the lock, with the debt of each series at the
// clock's now: the sum over the buckets labelled alike (a tenant's
// buckets of one unit; the tenants folded into "other"), each what it
// owed as last seen less what refill has repaid since. Buckets repaid are
// dropped, and their series with them.
func (d *Debts) Each(f func(v DebtValues, owed float64)) {
	if d.n.Load() == 0 {
		return
	}
	now := d.clock.Now()
	sums := make(map[DebtValues]float64)
	d.mu.Lock()
	for x := d.list.next; x != &d.list; {
		next := x.next
		if owed := x.at(now); owed > 0 {
			sums[x.values] += owed
		} else {
			d.drop(x)
		}
		x = next
	}
	d.mu.Unlock()
	for v, owed := range sums {
		f(v, owed)
	}
}

// drop stops following x. The caller holds mu.
func (d *Debts) drop(x *debt) {
	d.unlink(x)
	delete(d.m, x.key)
	d.n.Add(-1)
}

func (d *Debts) unlink(x *debt) {
	x.prev.next, x.next.prev = x.next, x.prev
	x.prev, x.next = nil, nil
}

func (d *Debts) pushFront(x *debt) {
	x.prev, x.next = &d.list, d.list.next
	d.list.next.prev = x
	d.list.next = x
}
