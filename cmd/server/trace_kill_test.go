package main

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// otlpReceiver is a loopback OTLP/HTTP traces endpoint that keeps every
// span the server processes export.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.export))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *otlpReceiver) export(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &msg)
	}
	if req.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, fmt.Sprintf("%s: %v", req.URL.Path, err), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// find returns the first span exported so far that match holds for.
func (r *otlpReceiver) find(match func(*tracepb.Span) bool) *tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if match(s) {
			return s
		}
	}
	return nil
}

func spanAttr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// TestTraceContinuesAfterKill: a replica killed with SIGKILL in the middle
// of a run exports the spans that ended before the kill; the replica that
// takes the run over continues the execution's trace from its record, and
// its run's span links to the killed run's span (the parent of the call
// that finished before the kill). The OTLP exporter is the real one, over
// HTTP to a loopback receiver.
func TestTraceContinuesAfterKill(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") that outlives the process")
	}
	st := storetest.New(t)
	hold, url := newHoldServer(t)
	otlp, endpoint := newOTLPReceiver(t)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  hold: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { hold: { ops: ["*"] } } }
`, url))
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_BSP_SCHEDULE_DELAY=20", "OTEL_SERVICE_NAME=patchbay-kill-test"}
	first := oneReplica(t, st, cfg, env...)
	status, ex := post2(first.addr, "k1", []byte(`{"workflow":{"version":1,"connections":{"hold":{}},"root":{"kind":"sequence","id":"main","steps":[
		{"kind":"call","id":"ping","connection":"hold","op":"ping","args":{}},
		{"kind":"call","id":"wait","connection":"hold","op":"hold","args":{}}]}}}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)
	until(t, "the held call", 20*time.Second, func() bool { return hold.holds.Load() == 1 })
	var ping *tracepb.Span
	until(t, "the ping call's span", 20*time.Second, func() bool {
		ping = otlp.find(func(s *tracepb.Span) bool { return spanAttr(s, "patchbay.step.id").GetStringValue() == "ping" })
		return ping != nil
	})
	if _, rec := get2(first.addr, "k1", "/v1/executions/"+id); hex.EncodeToString(ping.TraceId) != rec["traceId"] {
		t.Fatalf("ping span in trace %x, the execution says %v", ping.TraceId, rec["traceId"])
	}

	second := oneReplica(t, st, cfg, env...)
	first.kill()
	until(t, "the run to be taken over", 30*time.Second, func() bool { return hold.holds.Load() >= 2 })
	hold.letGo()
	done := waitDone(t, "http://"+second.addr, id)
	if done["status"] != "succeeded" {
		t.Fatalf("execution = %v", done)
	}
	var resumed *tracepb.Span
	until(t, "the resumed run's span", 20*time.Second, func() bool {
		resumed = otlp.find(func(s *tracepb.Span) bool {
			return s.Name == "execution" && spanAttr(s, "patchbay.execution.id").GetStringValue() == id && spanAttr(s, "patchbay.execution.resumed").GetBoolValue()
		})
		return resumed != nil
	})
	if !bytes.Equal(resumed.TraceId, ping.TraceId) {
		t.Fatalf("resumed run in trace %x, want the killed run's %x", resumed.TraceId, ping.TraceId)
	}
	if len(resumed.Links) != 1 || !bytes.Equal(resumed.Links[0].TraceId, ping.TraceId) || !bytes.Equal(resumed.Links[0].SpanId, ping.ParentSpanId) {
		t.Fatalf("resumed run links %v, want the killed run's span %x", resumed.Links, ping.ParentSpanId)
	}
	if bytes.Equal(resumed.SpanId, ping.ParentSpanId) {
		t.Fatal("the resumed run reuses the killed run's span id")
	}
	if otlp.find(func(s *tracepb.Span) bool { return bytes.Equal(s.SpanId, ping.ParentSpanId) }) != nil {
		t.Fatal("the killed run's span was exported: the kill came after the run ended")
	}
}
