package api_test

import (
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/api"
)

// TestHostileExpressionsThroughTheAPI replays the request that killed the
// server ("runtime: out of memory"): a 600 KB input repeated a million
// times. The execution fails its step naming the memory limit, an
// expression refused at submit is a 422 naming the limit and the field,
// and the server answers afterwards. (internal/sandbox's tests hold the
// full table, with timings and heap bounds.)
func TestHostileExpressionsThroughTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *api.Options) { o.MaxBodyBytes = 2 << 20 })
	const jsonCT = "application/json"
	doc := func(src string) string {
		return `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"x","connection":"mem","op":"echo","args":{"v":{"$expr":"` + src + `"}}}}`
	}
	input := `{"s":"` + strings.Repeat("0123456789", 60_000) + `"}`

	// Work is stopped by the steps limit, or under the race detector's
	// slowdown by the time limit first.
	for _, tc := range []struct{ name, src, limit, orLimit string }{
		{"the report's attack", `string(len(repeat($input.s, 1000000)))`, "memory limit", "memory limit"},
		{"string doubling", `reduce(1..64, #acc + #acc, $input.s)`, "memory limit", "memory limit"},
		{"O(N³) work", `let r = 1..2000; sum(r, sum(r, sum(r, 1)))`, "steps limit", "time limit"},
	} {
		r := b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+doc(tc.src)+`,"input":`+input+`,"wait":"10s"}`)
		if r.status != 200 {
			t.Fatalf("%s: POST = %d %.300s", tc.name, r.status, r.body)
		}
		ex := r.json(t)
		e, _ := ex["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if ex["status"] != "failed" || e["code"] != "step_failed" || !strings.Contains(msg, tc.limit) && !strings.Contains(msg, tc.orLimit) {
			t.Fatalf("%s: execution %s %v, want step_failed naming the %s", tc.name, ex["status"], e, tc.limit)
		}
	}

	deep := strings.Repeat("(", 100) + "1" + strings.Repeat(")", 100)
	r := b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+doc(deep)+`}`)
	if r.status != 422 || r.json(t)["code"] != "EXPRESSION_INVALID" ||
		!strings.Contains(string(r.body), `/workflow/root/args/v/$expr`) || !strings.Contains(string(r.body), "nesting depth limit") {
		t.Fatalf("deep nesting = %d %s", r.status, r.body)
	}

	// Still serving.
	r = b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+hello+`,"input":{"x":1},"wait":"10s"}`)
	if r.status != 200 || r.json(t)["status"] != "succeeded" {
		t.Fatalf("after the attacks: %d %s", r.status, r.body)
	}
}
