package agent

import (
	"context"
	"fmt"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// Run is what a model turn needs of the engine running its node. Each
// round, look and tool call is a ledger entry of the execution: the engine
// replays one that was done, records one when it is, and sends tool calls
// through the gates; the turn decides what to ask and when to stop.
type Run interface {
	// Input is the user message: the node's input as text.
	Input(ctx context.Context) (string, error)
	// ToolSet is the tools the node offers, cut to what the allowlist grants.
	ToolSet(ctx context.Context) (*ToolSet, error)
	// LookLayer is the reads shown to the model each round.
	LookLayer(ctx context.Context) (*LookLayer, error)
	// Look takes (or replays) the reads due before round; "" when none.
	Look(ctx context.Context, round int, l *LookLayer, effected map[string]bool) (string, error)
	// Round asks the model (or replays its answer).
	Round(ctx context.Context, round int, req ModelRequest) (*ModelResponse, error)
	// LookCall answers a "<connection>_look" call; false when call is not one.
	LookCall(ctx context.Context, round int, l *LookLayer, call ModelToolCall) (ModelToolResult, bool, error)
	// ToolCall runs (or replays) one tool call through the gates. A refusal
	// or a failure is a result the model reads; an error stops the turn.
	ToolCall(ctx context.Context, round int, ts *ToolSet, call ModelToolCall) (ModelToolResult, error)
	// EffectOf is the connection call may have changed; "" for none.
	EffectOf(ctx context.Context, ts *ToolSet, call ModelToolCall) string
	// Failed is the node's own failure, with code (a failure kind).
	Failed(code string, err error) error
}

// Turn runs a model node's loop over run: rounds until the model calls no
// tool (or until says stop), each round's tool calls in the model's order,
// the reads due before each round, and a structured output parsed and
// corrected once. Its output is the node's.
func Turn(ctx context.Context, spec *document.ModelSpec, run Run) (any, error) {
	input, err := run.Input(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := run.ToolSet(ctx)
	if err != nil {
		return nil, err
	}
	layer, err := run.LookLayer(ctx)
	if err != nil {
		return nil, err
	}
	if err := layer.AddLookTools(ts); err != nil {
		return nil, run.Failed(string(document.CodeToolIDCollision), err)
	}
	if err := ts.CheckChoice(spec.ToolChoice); err != nil {
		return nil, run.Failed(string(document.CodeUnknownToolChoice), err)
	}
	req := ModelRequest{Model: spec.Ref, Instructions: spec.Instructions, Tools: ts.List(), ToolChoice: spec.ToolChoice, MaxTokens: spec.MaxTokens,
		Messages: []ModelMessage{{Role: RoleUser, Text: input}}}
	if spec.Output != nil {
		req.Instructions = document.OutputInstruction(spec.Instructions, spec.Output.Raw)
		req.OutputSchema = spec.Output.Raw
	}
	limit := spec.MaxRounds
	if limit == 0 {
		limit = document.DefaultModelRounds
	}
	corrections := 0
	effected := map[string]bool{} // connections the last round's calls may have changed
	for round := 1; ; round++ {
		seen, err := run.Look(ctx, round, layer, effected)
		if err != nil {
			return nil, err
		}
		if seen != "" {
			req.Messages = append(req.Messages, ModelMessage{Role: RoleUser, Text: seen})
		}
		resp, err := run.Round(ctx, round, req)
		if err != nil {
			return nil, err
		}
		effected = map[string]bool{}
		req.Messages = append(req.Messages, ModelMessage{Role: RoleAssistant, Text: resp.Text, ToolCalls: resp.ToolCalls})
		if len(resp.ToolCalls) == 0 {
			if spec.Output == nil {
				return resp.Text, nil
			}
			out, err := spec.Output.Parse(resp.Text)
			if err == nil {
				return out, nil
			}
			if corrections == document.OutputRetries {
				return nil, run.Failed(fault.OutputInvalid, fmt.Errorf("round %d: %w (after %d corrective round)", round, err, document.OutputRetries))
			}
			// One more round, derived from the recorded answer, so a
			// resumed run asks (or replays) exactly the same.
			corrections++
			req.Messages = append(req.Messages, ModelMessage{Role: RoleUser,
				Text: err.Error() + ". Answer again with only the JSON value, matching the schema in your instructions."})
			continue
		}
		if round >= limit {
			if spec.MaxRounds > 0 {
				if spec.Output != nil {
					out, err := spec.Output.Parse(resp.Text)
					if err != nil {
						return nil, run.Failed(fault.OutputInvalid, fmt.Errorf("stopped at maxRounds %d while the model still called tools: %w", limit, err))
					}
					return out, nil
				}
				return resp.Text, nil
			}
			return nil, run.Failed(fault.StepFailed, fmt.Errorf("the model still calls tools after %d rounds; set until {\"maxRounds\": n} to stop earlier on purpose", limit))
		}
		results := make([]ModelToolResult, 0, len(resp.ToolCalls))
		for _, call := range resp.ToolCalls {
			res, isLook, err := run.LookCall(ctx, round, layer, call)
			if !isLook {
				res, err = run.ToolCall(ctx, round, ts, call)
			}
			if err != nil {
				return nil, err
			}
			if c := run.EffectOf(ctx, ts, call); c != "" {
				effected[c] = true
			}
			results = append(results, res)
		}
		req.Messages = append(req.Messages, ModelMessage{Role: RoleTool, ToolResults: results})
		if ForcesCall(req.ToolChoice) {
			// A forced call is the first round's: forced every round, the
			// model could never answer and the loop never end.
			req.ToolChoice = "auto"
		}
	}
}
