package web

// The package's other tests drive the UI over HTTP from web_test; these
// test the Agent section's unexported view and component directly.

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

func agentEv(typ string, data map[string]any) harness.Event {
	return harness.Event{Type: typ, Data: data}
}

func agentMessageEv(key, text string) harness.Event {
	return agentEv("agent.message", map[string]any{"key": key, "id": key, "text": text})
}

func agentCallEv(key string, fields ...string) harness.Event {
	data := map[string]any{"key": key, "id": key}
	for i := 0; i+1 < len(fields); i += 2 {
		data[fields[i]] = fields[i+1]
	}
	return agentEv("agent.tool_call", data)
}

// plan is an agent.plan event as read back from the stream: entries
// decoded from JSON.
func agentPlanEv(key string, entries ...[3]string) harness.Event {
	list := []any{}
	for _, e := range entries {
		list = append(list, map[string]any{"content": e[0], "priority": e[1], "status": e[2]})
	}
	return agentEv("agent.plan", map[string]any{"key": key, "id": key, "entries": list})
}

func TestAgentViews(t *testing.T) {
	long := strings.Repeat("a", maxAgentTextShown-1) + "é" + "tail" // é straddles the bound
	manyCalls := []harness.Event{}
	for i := range maxAgentCallsShown + 3 {
		manyCalls = append(manyCalls, agentCallEv("coder", "toolCallId", "c"+itoa(int64(i))))
	}
	manyCalls = append(manyCalls, agentCallEv("coder", "toolCallId", "c0", "status", "completed"))
	for _, tc := range []struct {
		name   string
		events []harness.Event
		want   []agentView
	}{
		{name: "none", events: nil, want: []agentView{}},
		{
			name: "unrelated events ignored",
			events: []harness.Event{
				agentEv(harness.EventStepStarted, map[string]any{"key": "coder", "id": "coder"}),
				agentEv("agent.other", map[string]any{"key": "coder", "id": "coder", "text": "x"}),
				agentEv("agent.message", map[string]any{"text": "no node"}),
			},
			want: []agentView{},
		},
		{
			name:   "pieces concatenated in order",
			events: []harness.Event{agentMessageEv("coder", "Hel"), agentEv(harness.EventStepTask, map[string]any{"id": "x"}), agentMessageEv("coder", "lo, "), agentMessageEv("coder", "world")},
			want:   []agentView{{Key: "coder", ID: "coder", Text: "Hello, world"}},
		},
		{
			name: "tool call updates merged in first-seen order",
			events: []harness.Event{
				agentCallEv("coder", "toolCallId", "t1", "title", "Read main.go", "kind", "read", "status", "pending"),
				agentCallEv("coder", "toolCallId", "t2", "title", "Run tests", "kind", "execute"),
				agentCallEv("coder", "toolCallId", "t1", "status", "completed"),
				agentCallEv("coder", "toolCallId", "t2", "title", "Run go test", "status", "in_progress"),
				agentCallEv("coder", "title", "no id"),
			},
			want: []agentView{{Key: "coder", ID: "coder", Calls: []agentCall{
				{ID: "t1", Title: "Read main.go", Kind: "read", Status: "completed"},
				{ID: "t2", Title: "Run go test", Kind: "execute", Status: "in_progress"},
			}}},
		},
		{
			name: "plan replaced",
			events: []harness.Event{
				agentPlanEv("coder", [3]string{"read", "high", "in_progress"}, [3]string{"fix", "medium", "pending"}),
				agentPlanEv("coder", [3]string{"read", "high", "completed"}),
			},
			want: []agentView{{Key: "coder", ID: "coder", Plan: []agentPlanEntry{{Content: "read", Priority: "high", Status: "completed"}}}},
		},
		{
			name: "two nodes kept apart",
			events: []harness.Event{
				agentMessageEv("a", "one "), agentMessageEv("b", "two "), agentCallEv("b", "toolCallId", "t1", "title", "b's"),
				agentMessageEv("a", "three"), agentPlanEv("a", [3]string{"x", "low", "pending"}), agentMessageEv("b", "four"),
			},
			want: []agentView{
				{Key: "a", ID: "a", Text: "one three", Plan: []agentPlanEntry{{Content: "x", Priority: "low", Status: "pending"}}},
				{Key: "b", ID: "b", Text: "two four", Calls: []agentCall{{ID: "t1", Title: "b's"}}},
			},
		},
		{
			name: "iterations of one node kept apart by key",
			events: []harness.Event{
				agentEv("agent.message", map[string]any{"key": "coder[0]", "id": "coder", "text": "first"}),
				agentEv("agent.message", map[string]any{"key": "coder[1]", "id": "coder", "text": "second"}),
			},
			want: []agentView{{Key: "coder[0]", ID: "coder", Text: "first"}, {Key: "coder[1]", ID: "coder", Text: "second"}},
		},
		{
			name:   "text over the bound cut, not within a character",
			events: []harness.Event{agentMessageEv("coder", long[:10]), agentMessageEv("coder", long[10:]), agentMessageEv("coder", "more")},
			want:   []agentView{{Key: "coder", ID: "coder", Text: strings.Repeat("a", maxAgentTextShown-1), TextCut: true}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := agentViews(tc.events)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("agentViews =\n%+v\nwant\n%+v", clipViews(got), clipViews(tc.want))
			}
		})
	}

	t.Run("tool calls over the bound", func(t *testing.T) {
		got := agentViews(manyCalls)
		if len(got) != 1 || len(got[0].Calls) != maxAgentCallsShown || got[0].MoreCalls != 3 {
			t.Fatalf("calls %d, more %d; want %d and 3", len(got[0].Calls), got[0].MoreCalls, maxAgentCallsShown)
		}
		if c := got[0].Calls[0]; c.ID != "c0" || c.Status != "completed" {
			t.Errorf("first call %+v, want c0 completed (a shown call still updates)", c)
		}
	})
}

// clip keeps a failure message readable when a view holds 64 KiB.
func clipViews(vs []agentView) []agentView {
	out := make([]agentView, len(vs))
	for i, v := range vs {
		if len(v.Text) > 40 {
			v.Text = v.Text[:20] + "…" + v.Text[len(v.Text)-20:] + " (" + itoa(int64(len(v.Text))) + " bytes)"
		}
		out[i] = v
	}
	return out
}

func renderAgentPage(t *testing.T, d executionData) (*goquery.Document, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := executionPage(page{Title: "Execution " + d.Ex.ID, Nav: "executions"}, d).Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	doc, err := goquery.NewDocumentFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return doc, buf.String()
}

func TestAgentSectionRendered(t *testing.T) {
	events := []harness.Event{
		agentEv(harness.EventStepStarted, map[string]any{"key": "coder", "id": "coder"}),
		agentMessageEv("coder", "Done. <script>alert(1)</script>\n"),
		agentMessageEv("coder", "Second line & more"),
		agentCallEv("coder", "toolCallId", "call-1", "title", "Edit <b>main.go</b>", "kind", "edit", "status", "pending"),
		agentCallEv("coder", "toolCallId", "call-1", "status", "completed"),
		agentPlanEv("coder", [3]string{"Write the fix", "high", "in_progress"}),
		agentMessageEv("big", strings.Repeat("x", maxAgentTextShown+1)),
	}
	ex := &harness.Execution{ID: "ex-1", Status: harness.ExecSucceeded, CreatedAt: time.Now()}
	d := executionData{Ex: ex, Events: events, Agents: agentViews(events)}
	doc, html := renderAgentPage(t, d)

	sec := doc.Find(`section[aria-labelledby="h-agent"]`)
	if sec.Length() != 1 || strings.TrimSpace(sec.Find("h2#h-agent").Text()) != "Agent" {
		t.Fatalf("no Agent section:\n%s", html)
	}
	if !sec.NextAllFiltered(`section[aria-labelledby="h-events"]`).Is("section") {
		t.Error("the Agent section is not before the Events section")
	}

	coder := sec.Find(`.agent[data-agent="coder"]`)
	if got, want := coder.Find("pre.agent-message").Text(), "Done. <script>alert(1)</script>\nSecond line & more"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if coder.Find("script").Length() != 0 || doc.Find("script:contains('alert')").Length() != 0 {
		t.Error("the message became markup")
	}
	if !strings.Contains(html, "Done. &lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("the message is not escaped in the page")
	}
	if coder.Find(".agent-cut").Length() != 0 {
		t.Error("a short message is said to be cut")
	}

	row := coder.Find(`table.agent-calls tr[data-tool-call="call-1"] td`)
	var cells []string
	row.Each(func(_ int, s *goquery.Selection) { cells = append(cells, strings.TrimSpace(s.Text())) })
	if want := []string{"call-1", "Edit <b>main.go</b>", "edit", "completed"}; !reflect.DeepEqual(cells, want) {
		t.Errorf("tool call row %q, want %q", cells, want)
	}
	if coder.Find("table.agent-calls b").Length() != 0 {
		t.Error("the tool call title became markup")
	}

	entry := coder.Find("ol.agent-plan > li")
	if entry.Length() != 1 || entry.AttrOr("data-status", "") != "in_progress" ||
		!strings.Contains(entry.Text(), "Write the fix") || strings.TrimSpace(entry.Find(".badge").Text()) != "in_progress" {
		t.Errorf("plan entry %q", entry.Text())
	}

	big := sec.Find(`.agent[data-agent="big"]`)
	if n := len(big.Find("pre.agent-message").Text()); n != maxAgentTextShown {
		t.Errorf("cut message has %d bytes, want %d", n, maxAgentTextShown)
	}
	if !strings.Contains(big.Find(".agent-cut").Text(), "64 KiB") {
		t.Error("no note that the message was cut")
	}
}

func TestAgentSectionAbsentWithoutAgentEvents(t *testing.T) {
	events := []harness.Event{agentEv(harness.EventStepStarted, map[string]any{"key": "s", "id": "s"})}
	ex := &harness.Execution{ID: "ex-2", Status: harness.ExecSucceeded, CreatedAt: time.Now()}
	doc, _ := renderAgentPage(t, executionData{Ex: ex, Events: events, Agents: agentViews(events)})
	if doc.Find("#h-agent").Length() != 0 {
		t.Error("an Agent section without agent events")
	}
	if doc.Find("#h-events").Length() != 1 {
		t.Error("no Events section")
	}
}
