package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// fakeRun answers rounds from a script and records what the turn asked.
type fakeRun struct {
	rounds  []ModelResponse // the model's answer to each round, in order
	asked   []ModelRequest
	calls   []string // "<round>:<call id>"
	lookErr error
}

func (f *fakeRun) Input(context.Context) (string, error) { return "hello", nil }

func (f *fakeRun) ToolSet(context.Context) (*ToolSet, error) { return BuildToolSet(nil, nil, false) }

func (f *fakeRun) LookLayer(context.Context) (*LookLayer, error) {
	return &LookLayer{Shown: map[string]string{}, Ask: map[string]string{}}, nil
}

func (f *fakeRun) Look(context.Context, int, *LookLayer, map[string]bool) (string, error) {
	return "", f.lookErr
}

func (f *fakeRun) Round(_ context.Context, round int, req ModelRequest) (*ModelResponse, error) {
	req.Messages = slices.Clone(req.Messages)
	f.asked = append(f.asked, req)
	if round > len(f.rounds) {
		return nil, fmt.Errorf("round %d was not scripted", round)
	}
	return &f.rounds[round-1], nil
}

func (f *fakeRun) LookCall(context.Context, int, *LookLayer, ModelToolCall) (ModelToolResult, bool, error) {
	return ModelToolResult{}, false, nil
}

func (f *fakeRun) ToolCall(_ context.Context, round int, _ *ToolSet, call ModelToolCall) (ModelToolResult, error) {
	f.calls = append(f.calls, fmt.Sprintf("%d:%s", round, call.ID))
	return ModelToolResult{CallID: call.ID, Content: "ok " + call.ID}, nil
}

func (f *fakeRun) EffectOf(context.Context, *ToolSet, ModelToolCall) string { return "" }

func (f *fakeRun) Failed(code string, err error) error { return fmt.Errorf("%s: %w", code, err) }

func calling(ids ...string) ModelResponse {
	r := ModelResponse{Text: "calling"}
	for _, id := range ids {
		r.ToolCalls = append(r.ToolCalls, ModelToolCall{ID: id, Name: "svc_op"})
	}
	return r
}

func TestTurn(t *testing.T) {
	for _, tt := range []struct {
		name      string
		spec      document.ModelSpec
		rounds    []ModelResponse
		out       any
		errCode   string
		calls     []string
		lastTools int // tool results sent with the last round
	}{
		{name: "answers at once", spec: document.ModelSpec{Ref: "m/x"}, rounds: []ModelResponse{{Text: "done"}}, out: "done"},
		{name: "tool calls in the model's order, then the answer", spec: document.ModelSpec{Ref: "m/x"},
			rounds: []ModelResponse{calling("a", "b"), calling("c"), {Text: "done"}}, out: "done",
			calls: []string{"1:a", "1:b", "2:c"}, lastTools: 1},
		{name: "maxRounds stops with the last text", spec: document.ModelSpec{Ref: "m/x", MaxRounds: 2},
			rounds: []ModelResponse{calling("a"), calling("b")}, out: "calling", calls: []string{"1:a"}, lastTools: 1},
		{name: "the default bound fails the node", spec: document.ModelSpec{Ref: "m/x"},
			rounds: slices.Repeat([]ModelResponse{calling("a")}, document.DefaultModelRounds), errCode: fault.StepFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run := &fakeRun{rounds: tt.rounds}
			out, err := Turn(t.Context(), &tt.spec, run)
			if tt.errCode != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.errCode+": ") {
					t.Fatalf("Turn = %v, %v; want a %s failure", out, err, tt.errCode)
				}
				return
			}
			if err != nil || out != tt.out {
				t.Fatalf("Turn = %v, %v; want %v", out, err, tt.out)
			}
			if tt.calls != nil && !slices.Equal(run.calls, tt.calls) {
				t.Errorf("tool calls %v, want %v", run.calls, tt.calls)
			}
			last := run.asked[len(run.asked)-1].Messages
			if tt.lastTools > 0 && len(last[len(last)-1].ToolResults) != tt.lastTools {
				t.Errorf("last round was sent %+v, want %d tool results", last[len(last)-1], tt.lastTools)
			}
		})
	}
}

// A forced tool choice holds for the first round only: forced every round
// the model could never answer.
func TestTurnForcesOnlyTheFirstRound(t *testing.T) {
	run := &fakeRun{rounds: []ModelResponse{calling("a"), {Text: "done"}}}
	spec := document.ModelSpec{Ref: "m/x", ToolChoice: "required"}
	if _, err := Turn(t.Context(), &spec, run); err != nil {
		t.Fatal(err)
	}
	if got := []string{run.asked[0].ToolChoice, run.asked[1].ToolChoice}; !slices.Equal(got, []string{"required", "auto"}) {
		t.Fatalf("tool choices %v, want [required auto]", got)
	}
}

// An error from the engine (a look, a round) stops the turn as it is.
func TestTurnStopsOnTheEnginesError(t *testing.T) {
	stop := errors.New("execution waits")
	run := &fakeRun{lookErr: stop}
	if _, err := Turn(t.Context(), &document.ModelSpec{Ref: "m/x"}, run); !errors.Is(err, stop) {
		t.Fatalf("Turn = %v, want %v", err, stop)
	}
}
