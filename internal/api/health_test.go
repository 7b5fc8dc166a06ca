package api

import (
	"fmt"
	"testing"
	"time"
)

// TestOperationLabelsStayBounded: 10,000 distinct operation names (and
// connection names) make at most maxLabelValues series each, plus
// "other".
func TestOperationLabelsStayBounded(t *testing.T) {
	t.Parallel()
	m := NewMetrics()
	for i := range 10_000 {
		m.CallDone(fmt.Sprintf("conn%d", i%300), fmt.Sprintf("op%d", i), "ok", time.Millisecond)
	}
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "patchbay_call_duration_seconds", "patchbay_connection_calls_total":
		default:
			continue
		}
		ops, conns := map[string]bool{}, map[string]bool{}
		var total uint64
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "op":
					ops[l.GetValue()] = true
				case "connection":
					conns[l.GetValue()] = true
				}
			}
			if h := s.GetHistogram(); h != nil {
				total += h.GetSampleCount()
			}
			if c := s.GetCounter(); c != nil {
				total += uint64(c.GetValue())
			}
		}
		if len(ops) > maxLabelValues+1 || !ops[otherLabel] || len(conns) > maxLabelValues+1 {
			t.Errorf("%s: %d op values, %d connection values (cap %d + other)", f.GetName(), len(ops), len(conns), maxLabelValues)
		}
		if total != 10_000 {
			t.Errorf("%s counts %d calls, want all 10000", f.GetName(), total)
		}
		if len(f.GetMetric()) > (maxLabelValues+1)*(maxLabelValues+1) {
			t.Errorf("%s: %d series", f.GetName(), len(f.GetMetric()))
		}
	}
}
