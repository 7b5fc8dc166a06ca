package api_test

import (
	"testing"
	"time"
)

// TestSmallInputs covers the inputs that once answered 500 or were
// silently changed: malformed event ids, numbers no float64 holds, and
// unknown members of the bodies the contract closes.
func TestSmallInputs(t *testing.T) {
	const jsonCT = "application/json"
	t.Parallel()
	b := setup(t)
	r := b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"echo","args":{"x":1}}}}`)
	if r.status != 202 {
		t.Fatalf("POST = %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	events := "/v1/executions/" + id + "/events"
	tests := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, field              string
	}{
		{"garbage Last-Event-ID", "GET", events, "", []string{"Last-Event-ID", "garbage"}, 400, "INVALID_EVENT_ID", ""},
		{"garbage after", "GET", events + "?after=1-2-3", "", nil, 400, "INVALID_EVENT_ID", ""},
		{"Last-Event-ID past 64 bits", "GET", events, "", []string{"Last-Event-ID", "99999999999999999999999-0"}, 400, "INVALID_EVENT_ID", ""},
		{"negative after", "GET", events + "?after=-1", "", nil, 400, "INVALID_EVENT_ID", ""},
		{"input number overflows", "POST", "/v1/executions", `{"workflow":{},"input":{"n":1e400}}`, nil, 400, "NUMBER_OUT_OF_RANGE", "/input/n"},
		{"workflow number overflows", "POST", "/v1/executions", `{"workflow":{"version":1e999}}`, nil, 400, "NUMBER_OUT_OF_RANGE", "/workflow/version"},
		{"pushed payload overflows", "POST", "/v1/sources/deploys/events", `{"type":"deploy.failed","id":"big","payload":{"service":"a","n":-1e400}}`, nil, 400, "NUMBER_OUT_OF_RANGE", "/payload/n"},
		{"unknown member of resume", "POST", "/v1/executions/" + id + "/resume", `{"rerun":[],"force":true}`, nil, 422, "VALIDATION_FAILED", "/force"},
		{"rerun of the wrong type", "POST", "/v1/executions/" + id + "/resume", `{"rerun":"mem"}`, nil, 422, "VALIDATION_FAILED", "/rerun"},
		{"resume body not an object", "POST", "/v1/executions/" + id + "/resume", `[]`, nil, 400, "MALFORMED_JSON", ""},
		{"unknown member of a decision", "POST", "/v1/approvals/ap_nope/approve", `{"note":"ok","as":"admin"}`, nil, 422, "VALIDATION_FAILED", "/as"},
		{"note of the wrong type", "POST", "/v1/approvals/ap_nope/deny", `{"note":5}`, nil, 422, "VALIDATION_FAILED", "/note"},
	}
	big := `{"type":"deploy.failed","payload":{"service":"a","n":1e400}}`
	tests = append(tests, struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, field              string
	}{"webhook payload overflows", "POST", "/hooks/deploys", big, signed(t, hookSecret, "msg_big", time.Now(), big), 400, "VALIDATION_FAILED", "/payload/n"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := ""
			if tt.body != "" {
				ct = jsonCT
			}
			r := b.do(t, tt.method, tt.path, ct, tt.body, tt.headers...)
			if r.status != tt.status || r.json(t)["code"] != tt.code {
				t.Fatalf("%s %s = %d %s, want %d %s", tt.method, tt.path, r.status, r.body, tt.status, tt.code)
			}
			if tt.field == "" {
				return
			}
			for _, e := range r.json(t)["errors"].([]any) {
				if e.(map[string]any)["path"] == tt.field {
					return
				}
			}
			t.Fatalf("problem %s names no field %s", r.body, tt.field)
		})
	}
	// A valid id still resumes the stream where it left off.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = b.do(t, "GET", "/v1/executions/"+id, "", "")
		if r.json(t)["status"] == "succeeded" || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	all := parseSSE(string(b.do(t, "GET", events, "", "").body))
	if len(all) < 2 {
		t.Fatalf("events = %v", all)
	}
	rest := parseSSE(string(b.do(t, "GET", events, "", "", "Last-Event-ID", all[0].id).body))
	if len(rest) != len(all)-1 {
		t.Fatalf("after %s: %d events, want %d", all[0].id, len(rest), len(all)-1)
	}
}
