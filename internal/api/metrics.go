package api

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// Metrics holds patchbay's Prometheus collectors on a registry of its own,
// so tests and several servers in one process do not collide. It is the
// harness's Observer.
type Metrics struct {
	registry   *prometheus.Registry
	requests   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	executions *prometheus.CounterVec
	calls      *prometheus.CounterVec
	callTime   *prometheus.HistogramVec
	tokens     *prometheus.CounterVec
	looks      *prometheus.CounterVec
	lookTokens *prometheus.CounterVec
	questions  *prometheus.CounterVec
	// models bounds the model label: names come from documents, so past
	// maxModelLabels distinct ones the rest count as "other".
	modelsMu sync.Mutex
	models   map[string]bool
	health   *health
}

// maxModelLabels bounds the distinct model names patchbay_model_tokens_total
// carries.
const maxModelLabels = 100

// NewMetrics registers the collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_http_requests_total", Help: "HTTP requests by method, route and status.",
		}, []string{"method", "route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_http_request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route"}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_executions_total", Help: "Executions entering each state.",
		}, []string{"state"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_connection_calls_total", Help: "Connection calls by connection, operation and outcome (ok, error, failure).",
		}, []string{"connection", "op", "outcome"}),
		callTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "patchbay_connection_call_duration_seconds", Help: "Connection call latency.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"connection", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_model_tokens_total", Help: "Model tokens by provider, model and direction (input, output).",
		}, []string{"provider", "model", "direction"}),
		looks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_looks_total", Help: "Profile reads shown to models, by read and form (full, diff, unchanged, failed).",
		}, []string{"read", "form"}),
		lookTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_look_tokens_total", Help: "Estimated tokens (bytes/4) of profile reads shown to models, by read and form.",
		}, []string{"read", "form"}),
		questions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "patchbay_questions_total", Help: "Servers' questions (elicitations) by state entered: asked, answered, declined, cancelled, expired.",
		}, []string{"state"}),
		models: map[string]bool{}, health: newHealth(),
	}
	for _, s := range questionStates {
		m.questions.WithLabelValues(s) // present at 0 before the first question
	}
	m.registry.MustRegister(m.requests, m.latency, m.executions, m.calls, m.callTime, m.tokens, m.looks, m.lookTokens, m.questions,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(m.health.collectors()...)
	return m
}

// CallDone records one connection call.
func (m *Metrics) CallDone(connection, op, outcome string, d time.Duration) {
	connection, op = m.health.conns.value(connection), m.health.ops.value(op)
	m.health.opCallTime.WithLabelValues(connection, op).Observe(d.Seconds())
	m.calls.WithLabelValues(connection, op, outcome).Inc()
	m.callTime.WithLabelValues(connection, outcome).Observe(d.Seconds())
}

// ExecutionEntered counts an execution entering state.
func (m *Metrics) ExecutionEntered(state harness.ExecState) {
	m.executions.WithLabelValues(string(state)).Inc()
}

// questionStates are the state labels of patchbay_questions_total.
var questionStates = []string{"asked", "answered", "declined", "cancelled", "expired"}

// QuestionEntered counts a server's question entering state (a
// gates.QuestionState; pending, a question first asked, counts as asked).
// The engine calls it through its observer for what gates.QuestionHooks'
// Observe reports. Other values are not counted, so the label set stays
// bounded.
func (m *Metrics) QuestionEntered(state string) {
	if state == string(gates.QuestionPending) {
		state = "asked"
	}
	if slices.Contains(questionStates, state) {
		m.questions.WithLabelValues(state).Inc()
	}
}

// ModelTokens counts the tokens of one model round.
func (m *Metrics) ModelTokens(provider, model, direction string, tokens int64) {
	if tokens <= 0 {
		return
	}
	key := provider + "/" + model
	m.modelsMu.Lock()
	if !m.models[key] {
		if len(m.models) >= maxModelLabels {
			model = "other"
		} else {
			m.models[key] = true
		}
	}
	m.modelsMu.Unlock()
	m.tokens.WithLabelValues(provider, model, direction).Add(float64(tokens))
}

// LookTokens counts one profile read shown to a model. Read names come
// from the loaded profiles, so the label set is bounded by the catalog.
func (m *Metrics) LookTokens(read, form string, tokens int) {
	m.looks.WithLabelValues(read, form).Inc()
	m.lookTokens.WithLabelValues(read, form).Add(float64(tokens))
}

var (
	_ harness.Observer    = (*Metrics)(nil)
	_ agent.TokenObserver = (*Metrics)(nil)
	_ agent.LookObserver  = (*Metrics)(nil)
)

func (m *Metrics) handler() echo.HandlerFunc {
	return echo.WrapHandler(promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
}

// middleware counts requests by route template, not raw path, so ids do
// not explode the label set.
func (m *Metrics) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		status := c.Response().Status
		if err != nil {
			status = toProblem(err).Status
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		m.requests.WithLabelValues(c.Request().Method, route, strconv.Itoa(status)).Inc()
		m.latency.WithLabelValues(c.Request().Method, route).Observe(time.Since(start).Seconds())
		return err
	}
}
