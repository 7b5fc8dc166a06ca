package api

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// exposedNames are the series names /metrics can show once every figure
// was observed once: histograms with their _bucket, _sum and _count.
func exposedNames(t *testing.T) map[string]bool {
	t.Helper()
	m := NewMetrics()
	m.CallDone("c", "op", "ok", time.Millisecond)
	m.ExecutionEntered(harness.ExecRunning)
	m.ModelTokens("p", "m", "input", 1)
	m.ExecutionDone(harness.ExecSucceeded, time.Second)
	m.StepDone("model", "", "", "ok", time.Second)
	m.GateRefused(4)
	m.ApprovalDecided(gates.ApprovalApproved, time.Minute)
	m.LeaseWaited("pool", time.Second)
	m.Started("src", "t", time.Second)
	m.DeadLettered("src")
	m.RedisDone("get", time.Millisecond)
	m.WatchApprovals(func(context.Context) (int64, error) { return 3, nil })
	m.WatchPools(func(context.Context) []PoolUsage { return []PoolUsage{{Pool: "p", Max: 2, Leased: 1}} })
	m.requests.WithLabelValues("GET", "/x", "200").Inc()
	m.latency.WithLabelValues("GET", "/x").Observe(0.1)
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\bpatchbay_[a-z_]+`)

// checkExpr fails for an expression that names a metric patchbay does not
// expose, or whose brackets do not balance.
func checkExpr(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	if strings.TrimSpace(expr) == "" {
		t.Errorf("%s: empty expression", where)
	}
	found := metricName.FindAllString(expr, -1)
	if len(found) == 0 {
		t.Errorf("%s: %q names no patchbay metric", where, expr)
	}
	for _, n := range found {
		if !names[n] {
			t.Errorf("%s: %q names %s, which patchbay does not expose", where, expr, n)
		}
	}
	depth := map[rune]int{}
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range expr {
		switch r {
		case '(', '[', '{':
			depth[r]++
		case ')', ']', '}':
			depth[pairs[r]]--
		}
	}
	for r, d := range depth {
		if d != 0 {
			t.Errorf("%s: %q has unbalanced %c", where, expr, r)
		}
	}
}

func TestGrafanaDashboardUsesExposedMetrics(t *testing.T) {
	t.Parallel()
	names := exposedNames(t)
	data, err := os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.Title == "" || len(dash.Panels) < 10 {
		t.Fatalf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkExpr(t, "panel "+p.Title, tg.Expr, names)
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				used[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	// Every health metric has a panel.
	for _, n := range []string{"patchbay_execution_duration_seconds", "patchbay_call_duration_seconds", "patchbay_step_duration_seconds",
		"patchbay_gate_refusals_total", "patchbay_approvals_pending", "patchbay_approval_wait_seconds", "patchbay_inbox_lag_seconds",
		"patchbay_dead_letters_total", "patchbay_lease_wait_seconds", "patchbay_pool_leases", "patchbay_redis_duration_seconds", "patchbay_model_tokens_total"} {
		if !used[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
}

func TestAlertRulesUseExposedMetrics(t *testing.T) {
	t.Parallel()
	names := exposedNames(t)
	data, err := os.ReadFile("../../deploy/prometheus-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v lacks a name, severity or summary", r)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			checkExpr(t, "alert "+r.Alert, r.Expr, names)
		}
	}
	if n < 8 {
		t.Fatalf("%d alert rules", n)
	}
}

// TestComposeTracingProfile: the compose file parses and its tracing
// profile has the collector and Jaeger, the collector's pipeline
// forwarding to Jaeger.
func TestComposeTracingProfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Profiles []string `yaml:"profiles"`
		} `yaml:"services"`
		Configs map[string]struct {
			Content string `yaml:"content"`
		} `yaml:"configs"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"otel-collector", "jaeger"} {
		svc, ok := compose.Services[s]
		if !ok || len(svc.Profiles) != 1 || svc.Profiles[0] != "tracing" {
			t.Errorf("service %s = %+v, want it in the tracing profile", s, svc)
		}
	}
	var col struct {
		Service struct {
			Pipelines map[string]struct {
				Receivers []string `yaml:"receivers"`
				Exporters []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
	}
	if err := yaml.Unmarshal([]byte(compose.Configs["otelcol"].Content), &col); err != nil {
		t.Fatal(err)
	}
	p := col.Service.Pipelines["traces"]
	if len(p.Receivers) != 1 || p.Receivers[0] != "otlp" || len(p.Exporters) != 1 || p.Exporters[0] != "otlp/jaeger" {
		t.Fatalf("collector traces pipeline = %+v", p)
	}
}
