// Package cpugate is a CPU gate: it samples how busy the CPU available to
// this process is and publishes one scale, in (0, 1], that every rate limit
// is multiplied by. Under saturation the scale drops, so every client's
// bucket shrinks at once; once the CPU has stayed cool for a cooldown, the
// limits come back.
//
// The gate is the classic protection. Package overload keeps more of an
// overloaded server's capacity and sheds the tenants over their fair share
// rather than every tenant alike; it uses a Gate only as its guard, for
// CPU readings ([Gate.Reading]).
//
//	sampler, source, err := cpugate.NewSampler() // cgroup, process or host
//	gate, err := cpugate.New(sampler)            // Adaptive; WithPolicy(cpugate.Fixed{}) for the classic
//	go gate.Run(ctx)                             // the caller owns the loop
//	lim = gate.Apply(lim)                        // on the request path
//
// # The model
//
// A [Sampler] returns a [Reading]: the fraction of the CPU available to this
// process that was busy since the previous reading. "Available" is what this
// process can use, the least of: its container's cgroup quota (the smallest
// among its cgroup and their ancestors), the CPUs it may run on (its cpuset
// and affinity mask) and GOMAXPROCS, all re-read every few seconds because
// each can change at run time. A process held to fewer CPUs than its quota
// is saturated at what it holds: pinned to one CPU in a container allowed
// two, it reads 1, not 0.5. A cgroup's usage counts all its processes, so
// with others sharing the cgroup it can exceed a budget bounded by this
// process's limits; it is then reported as 1. [NewSampler] picks the best
// source: [CgroupSampler] (cgroup v2 or v1) or [ProcessSampler] (getrusage),
// both measured against that budget, or [HostSampler] (the whole machine
// against all its CPUs, through gopsutil), and names it for logs and
// metrics. [SchedGuard] adds a second signal, how long goroutines wait to
// run, which sees saturation that CPU use cannot (a noisy neighbour, CFS
// throttling).
//
// A failed sample is no reading: the gate keeps its state and counts the
// failure ([Snapshot.Failures]). It never guesses 0% or 100%.
//
// The controller is a pure function, [Policy].Step, from the previous
// [Control], a reading and the time to the next Control. The [Gate] holds the
// Control, steps it at each reading, and publishes the scale in one atomic
// word. Because the scale travels with each take (see package floodgate), a
// change applies at the next request, with no sweep over buckets.
//
// # The policies
//
// [Fixed] is the classic: at or above 80% CPU the scale drops to 0.2 and
// stays there until the CPU has been below 80% for 5 s, counted from the
// last hot reading; then it is 1 again. It is simple to reason about, but
// under sustained overload it can only alternate between its two levels.
//
// [Adaptive], the default, searches for the level the server can carry: it
// enters at 90% and recovers only below 80% (hysteresis). A saturated
// reading (97% or more) cuts the scale by half on entry and by a quarter at
// most every half second after; a reading between 90% and saturation cuts
// only what would bring it to 85%; the floor is 0.05. It waits out a
// cooldown from the last reading at or above 80% and ramps back by 5 points
// every 500 ms. Re-entering soon after recovering doubles the cooldown
// (capped), and a calm minute resets it. Under sustained overload it
// settles with the CPU between the two marks instead of oscillating.
//
// Both policies are configured by plain structs whose zero values are the
// defaults; [New] validates them and rejects out-of-range fields with an
// error naming the field, never clamping them.
//
// # Concurrency
//
// [Gate.Scale], [Gate.State] and [Gate.Apply] are single atomic loads, safe
// from any number of goroutines, and allocate nothing: they are for the
// request path. [Gate.Snapshot], [Gate.Observe] and [Gate.SampleAt] take a
// short lock, and the gate calls its sampler from one goroutine at a time.
// The log events run after the locks are released.
//
// Nothing in this package starts a goroutine. [Gate.Run] is the sampling
// loop, run by the caller and stopped by cancelling its context; tests and
// custom loops can instead call [Gate.SampleAt] or [Gate.Observe] with
// explicit times. The samplers are not safe for concurrent use: one gate
// drives one sampler.
//
// # Zero values
//
// The zero [Fixed] and [Adaptive] are the default policies. The zero
// [Control] is Open with full limits. A nil *Gate scales nothing: its Scale
// is 1 and Apply returns its argument, so a server can make the gate
// optional without nil checks. The zero Gate is not usable; make one with
// [New]. A zero [Reading] is an idle CPU, so samplers report failures as
// errors, never as zero readings.
package cpugate
