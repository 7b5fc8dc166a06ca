package api

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// health holds the metrics that answer "is it healthy": how long
// executions, steps and calls take, which gates refuse, how long
// approvals wait, how far behind the inboxes are, how long leases take,
// how busy the pools are, how long Redis takes to answer.
type health struct {
	execTime    *prometheus.HistogramVec
	stepTime    *prometheus.HistogramVec
	opCallTime  *prometheus.HistogramVec
	refusals    *prometheus.CounterVec
	approvals   *prometheus.HistogramVec
	inboxLag    *prometheus.HistogramVec
	deadLetters *prometheus.CounterVec
	leaseWait   *prometheus.HistogramVec
	redisTime   *prometheus.HistogramVec
	// ops and conns bound the op and connection labels: operation names
	// come from servers and documents, connection names from documents
	// too (servers they attach), so past maxLabelValues distinct ones
	// the rest count as "other".
	ops, conns, commands *capped
}

// maxLabelValues bounds the distinct values of a label fed by names
// patchbay does not control.
const maxLabelValues = 100

// otherLabel stands for every value past the cap.
const otherLabel = "other"

// latencyBuckets span a fast local call to a slow remote one.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// waitBuckets span seconds to a day: executions and approvals wait for
// people.
var waitBuckets = []float64{.1, .5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600}

func newHealth() *health {
	return &health{
		execTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_execution_duration_seconds", Help: "Executions from start to finish (waits included), by final state.",
			Buckets: waitBuckets,
		}, []string{"state"}),
		stepTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_step_duration_seconds", Help: "Steps other than calls and sequences (model, wait, verify, parallel) by kind and outcome.",
			Buckets: waitBuckets,
		}, []string{"kind", "outcome"}),
		opCallTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_call_duration_seconds", Help: "Connection call latency by connection and operation (at most 100 distinct of each; the rest are \"other\"), gates and approval waits included.",
			Buckets: latencyBuckets,
		}, []string{"connection", "op"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_gate_refusals_total", Help: "Calls refused, by the gate (1-6) that refused them.",
		}, []string{"gate"}),
		approvals: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_approval_wait_seconds", Help: "Time from an approval's request to its decision, by decision (approved, denied, expired).",
			Buckets: waitBuckets,
		}, []string{"state"}),
		inboxLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_inbox_lag_seconds", Help: "Time from an event's receipt to the start of its turn, by connection.",
			Buckets: latencyBuckets,
		}, []string{"connection"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_dead_letters_total", Help: "Events moved to the dead letters, by connection.",
		}, []string{"connection"}),
		leaseWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_lease_wait_seconds", Help: "Time to get a pool lease, by pool.",
			Buckets: waitBuckets,
		}, []string{"pool"}),
		redisTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_redis_duration_seconds", Help: "Redis round trips by command (pipelines as \"pipeline\").",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"command"}),
		ops: newCapped(maxLabelValues), conns: newCapped(maxLabelValues), commands: newCapped(maxLabelValues),
	}
}

func (h *health) collectors() []prometheus.Collector {
	return []prometheus.Collector{h.execTime, h.stepTime, h.opCallTime, h.refusals, h.approvals, h.inboxLag, h.deadLetters, h.leaseWait, h.redisTime}
}

// capped passes the first max distinct values of a label and turns the
// rest into "other".
type capped struct {
	mu   sync.Mutex
	seen map[string]bool
	max  int
}

func newCapped(max int) *capped { return &capped{seen: map[string]bool{}, max: max} }

func (c *capped) value(v string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[v] {
		return v
	}
	if len(c.seen) >= c.max {
		return otherLabel
	}
	c.seen[v] = true
	return v
}

// ExecutionDone records a finished execution.
func (m *Metrics) ExecutionDone(state harness.ExecState, d time.Duration) {
	m.health.execTime.WithLabelValues(string(state)).Observe(d.Seconds())
}

// StepDone records a step other than a call.
func (m *Metrics) StepDone(kind, _, _, outcome string, d time.Duration) {
	m.health.stepTime.WithLabelValues(kind, outcome).Observe(d.Seconds())
}

// GateRefused counts a refusal by its gate.
func (m *Metrics) GateRefused(gate int) {
	m.health.refusals.WithLabelValues(strconv.Itoa(gate)).Inc()
}

// ApprovalDecided records how long an approval waited for its decision.
func (m *Metrics) ApprovalDecided(state gates.ApprovalState, wait time.Duration) {
	m.health.approvals.WithLabelValues(string(state)).Observe(wait.Seconds())
}

// LeaseWaited records how long a pool lease took to get.
func (m *Metrics) LeaseWaited(pool string, d time.Duration) {
	m.health.leaseWait.WithLabelValues(m.health.conns.value(pool)).Observe(d.Seconds())
}

// Started records an event's turn starting: the inbox's lag.
func (m *Metrics) Started(connection, _ string, sinceReceived time.Duration) {
	m.health.inboxLag.WithLabelValues(connection).Observe(sinceReceived.Seconds())
}

// DeadLettered counts an event moved to the dead letters.
func (m *Metrics) DeadLettered(connection string) {
	m.health.deadLetters.WithLabelValues(connection).Inc()
}

// RedisDone records one Redis round trip.
func (m *Metrics) RedisDone(command string, d time.Duration) {
	m.health.redisTime.WithLabelValues(m.health.commands.value(command)).Observe(d.Seconds())
}

// WatchApprovals makes pending report the approvals waiting for a person
// at each scrape (patchbay_approvals_pending).
func (m *Metrics) WatchApprovals(pending func(ctx context.Context) (int64, error)) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "patchbay_approvals_pending", Help: "Approvals waiting for a person.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := pending(ctx)
		if err != nil {
			return -1
		}
		return float64(n)
	}))
}

// PoolUsage is one pool's leases at a scrape.
type PoolUsage struct {
	Pool           string
	Max, Leased, Q int
}

// WatchPools makes usage report the pools' leases at each scrape
// (patchbay_pool_leases{pool,state} and patchbay_pool_max{pool}).
func (m *Metrics) WatchPools(usage func(ctx context.Context) []PoolUsage) {
	m.registry.MustRegister(&poolCollector{usage: usage})
}

var (
	poolLeasesDesc = prometheus.NewDesc("patchbay_pool_leases", "Pool leases by state (leased, queued).", []string{"pool", "state"}, nil)
	poolMaxDesc    = prometheus.NewDesc("patchbay_pool_max", "Leases a pool may hand out at once.", []string{"pool"}, nil)
)

type poolCollector struct {
	usage func(ctx context.Context) []PoolUsage
}

func (p *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolLeasesDesc
	ch <- poolMaxDesc
}

func (p *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, u := range p.usage(ctx) {
		ch <- prometheus.MustNewConstMetric(poolLeasesDesc, prometheus.GaugeValue, float64(u.Leased), u.Pool, "leased")
		ch <- prometheus.MustNewConstMetric(poolLeasesDesc, prometheus.GaugeValue, float64(u.Q), u.Pool, "queued")
		ch <- prometheus.MustNewConstMetric(poolMaxDesc, prometheus.GaugeValue, float64(u.Max), u.Pool)
	}
}

var _ harness.HealthObserver = (*Metrics)(nil)
