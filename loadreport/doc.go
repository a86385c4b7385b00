// Package loadreport tells a server's clients how loaded it is, in the ORCA
// load reports that grpc-go's weighted_round_robin balancer reads, so that
// a fleet's clients send each replica what it completes and steer away from
// one before it has to shed.
//
//	lim, _ := middleware.NewOverload()
//	rep, _ := loadreport.New(lim.Overload())
//	srv := grpc.NewServer(append(lim.ServerOptions(), rep.ServerOptions()...)...)
//	rep.Register(srv) // out of band too (optional)
//
// and on the client, the service config that turns the balancer on:
//
//	grpc.NewClient(target, grpc.WithDefaultServiceConfig(loadreport.ServiceConfig))
//
// # What a report says
//
// Every call the server admits carries the report in its trailer
// (endpoint-load-metrics-bin); Register serves the same report out of band
// on ORCA's stream (xds.service.orca.v3), which grpc-go paces at 30 s or
// more. A report holds:
//
//   - application utilization: the calls admitted per second over the
//     controller's capacity estimate, its concurrency limit over its calls'
//     mean service time (Little's law), averaged over about a second to
//     smooth the limit's probing. The balancer's weight, calls per second
//     over utilization, is then that estimate: what this replica completes;
//   - QPS: the calls admitted per second; EPS: the calls shed per second
//     (by the controller, for any cause: quota rejections are a tenant's
//     business, not the replica's, and are left out), which the balancer
//     adds to the utilization in proportion to QPS;
//   - CPU utilization: this process's CPU time against the CPUs it can use
//     (the smaller of its affinity and GOMAXPROCS; [cpugate.ProcessSampler]),
//     unless WithSampler says otherwise;
//   - named metrics: floodgate.capacity (the estimate), floodgate.limit, floodgate.inflight, floodgate.queued,
//     floodgate.latency_seconds and floodgate.baseline_seconds, the
//     controller's [overload.Snapshot].
//
// The rates are smoothed over half a second, the capacity over a second, and the report is rebuilt at
// most once per interval (WithInterval, 250 ms by default) by the call that
// finds it stale: no goroutine, and a call that reports sends bytes
// encoded once per interval.
//
// ORCA's own service is exempt from the middleware's limits by default
// (middleware.WithExemptions's default), so a loaded replica still reports.
package loadreport
