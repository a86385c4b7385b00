package remote

import "time"

// A ShareRequest is one member's round in a rate divided among several
// members through a server: the rls package's quota replicas on Redis,
// through redisstore's Store.Share, which states the contract.
type ShareRequest struct {
	// Member names the caller, unique among the members of a key for as
	// long as its grant lives (a process's random name, so that a
	// restarted process does not take over its predecessor's grant).
	Member string
	// Limit is the rate, in units per second, that the members' grants
	// share: the store never lets their sum exceed it.
	Limit float64
	// Want is the rate this member asks for.
	Want float64
	// Hold is how long the grant lives on the server without another round:
	// past it, it leaves the sum and its rate is free for the others.
	// Hold = 0 gives back the member's grant at once (Want is then
	// ignored).
	Hold time.Duration
	// Draining marks the member as leaving (a replica shutting down): its
	// grant stays held until its hold passes, covering what it handed out,
	// but the other members may Claim it as its subscribers come to them.
	Draining bool
	// Claim is a rate to take from the grants of draining members before
	// this member's grant is computed: what the subscribers that came to
	// this member from a draining one held there, and no longer hold. The
	// rate taken (ShareReply.Claimed) leaves the draining grants, so it is
	// room this member's grant may take.
	Claim float64
	// Held and Demands are published for the other members' next rounds:
	// the part of the grant this member cannot re-divide (rates its
	// subscribers hold and have not yet been measured on), and its
	// subscribers' demands. The store keeps them as they are.
	Held    float64
	Demands []float64
}

// A ShareReply is what the store answered to a [ShareRequest].
type ShareReply struct {
	// Granted is the member's grant: min(Want, Limit − Σ the other
	// members' live grants), at least 0.
	Granted float64
	// Claimed is the rate of Claim taken from draining members, at most
	// Claim and at most their grants.
	Claimed float64
	// Others are the other members whose grants were live, in no
	// particular order.
	Others []ShareMember
}

// A ShareMember is another member's grant and what it published with its
// last round.
type ShareMember struct {
	Granted  float64
	Draining bool
	Held     float64
	Demands  []float64
}

// MaxShareDemands bounds the demands one [ShareRequest] publishes: 65,536.
const MaxShareDemands = 1 << 16
