package mcpserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
)

// TestQuestionsReachTheCallingClient: a question the server of a call
// made through /mcp asks goes to the calling client when it takes
// elicitations (the Go SDK's handler answers it), and otherwise waits in
// the queue for a person.
func TestQuestionsReachTheCallingClient(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{Hold: 20 * time.Second})
	params := &sdk.CallToolParams{Name: "ask_color", Arguments: map[string]any{}}

	for _, era := range eras {
		t.Run("the client answers/"+era, func(t *testing.T) {
			var asked string
			erin := dial(t, b, erinKey, era, &sdk.ClientOptions{
				ElicitationHandler: func(_ context.Context, req *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
					asked = req.Params.Message
					return &sdk.ElicitResult{Action: "accept", Content: map[string]any{"color": "green"}}, nil
				},
			})
			before, err := b.execs.Questions().List(t.Context(), gates.QuestionAnswered, 100)
			must(t, err)
			res, err := erin.CallTool(t.Context(), params)
			must(t, err)
			if res.IsError || !strings.Contains(text(res), `"color":"green"`) || !strings.Contains(text(res), `"action":"accept"`) {
				t.Fatalf("result = %s, want the client's answer sent to the server", text(res))
			}
			if asked != "Which color?" {
				t.Errorf("the client was asked %q", asked)
			}
			after, err := b.execs.Questions().List(t.Context(), gates.QuestionAnswered, 100)
			must(t, err)
			if len(after) != len(before)+1 || after[0].AnsweredBy != "erin" {
				t.Errorf("answered questions = %+v, want one more, answered by erin's client", after)
			}
		})
	}

	t.Run("a person answers for a client that takes none", func(t *testing.T) {
		erin := dial(t, b, erinKey, "2025-11-25", nil)
		go func() {
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				list, _ := b.execs.Questions().List(context.Background(), gates.QuestionPending, 10)
				if len(list) > 0 {
					_, _ = b.execs.Questions().Answer(context.Background(), list[0].ID,
						authz.Principal{Name: "approver", Roles: []authz.Role{authz.Approve}}, map[string]any{"color": "red"})
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		res, err := erin.CallTool(t.Context(), params)
		must(t, err)
		if res.IsError || !strings.Contains(text(res), `"color":"red"`) {
			t.Fatalf("result = %s, want the person's answer", text(res))
		}
	})
}
