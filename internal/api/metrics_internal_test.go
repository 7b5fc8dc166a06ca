package api

import "testing"

// TestLookMetrics counts profile reads shown to models and their tokens.
func TestLookMetrics(t *testing.T) {
	m := NewMetrics()
	m.LookTokens("ui.tree", "diff", 12)
	m.LookTokens("ui.tree", "diff", 30)
	m.LookTokens("browser.page.summary", "full", 9)
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			labels := ""
			for _, l := range metric.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + ","
			}
			got[f.GetName()+"{"+labels+"}"] = metric.GetCounter().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"patchbay_looks_total{form=diff,read=ui.tree,}":                    2,
		"patchbay_look_tokens_total{form=diff,read=ui.tree,}":              42,
		"patchbay_look_tokens_total{form=full,read=browser.page.summary,}": 9,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v", key, got[key], want)
		}
	}
}
