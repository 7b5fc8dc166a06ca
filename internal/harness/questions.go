package harness

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// Questions from servers (MCP elicitation), as the engine answers them.
// A call's Asker (connect.CallRequest.Ask) records each question a
// server asks while it answers the call in the question queue
// (gates.Questions), as a durable record a person answers through the
// API or the admin UI, and holds the call (and its worker) while it
// waits, up to the question's deadline (QuestionHold): the server holds
// its request open meanwhile, in either era as mcp-go speaks it. Past the
// deadline the question expires and the server is told "cancel".
//
// Some questions never reach a person: a mode the connection's policy
// declines (declineQuestions), and a form that asks for what looks like
// a secret (a password, a token: gates.CheckForm), which is declined with
// the reason in a question.declined event. Answers are not put in events
// or logs; the API shows them redacted.
//
// A model's or an agent's call that a question holds waits the same way;
// the model is never asked to answer.

// DefaultQuestionHold is how long a call is held for a question to be
// answered when ExecutionsOptions sets no QuestionHold.
const DefaultQuestionHold = 5 * time.Minute

// EventQuestionDeclined: a question declined without asking anyone.
const EventQuestionDeclined = "question.declined" // {step, connection, mode, reason}

// Questions is the question queue of these executions.
func (e *Executions) Questions() *gates.Questions { return e.questions }

// asker is the Asker of one call step (ledger key key) on conn.
func (r *run) asker(n *document.Node, key string, conn *registry.Connection) connect.Asker {
	var asked atomic.Int32
	return func(ctx context.Context, q connect.Question) (connect.Answer, error) {
		k := asked.Add(1)
		if why := declineWhy(conn.Policy(), q); why != "" {
			r.e.logger.InfoContext(ctx, "a server's question declined without asking", "execution", r.rec.ID, "step", n.ID, "connection", conn.Name(), "why", why)
			r.e.emit(ctx, r.rec.ID, EventQuestionDeclined, map[string]any{"step": n.ID, "connection": conn.Name(), "mode": q.Mode, "reason": why})
			r.e.observeQuestion(gates.QuestionDeclined)
			return connect.Answer{Action: connect.AnswerDecline}, nil
		}
		now := time.Now().UTC()
		asking := &gates.Question{
			ID: gates.QuestionID(r.rec.ID, fmt.Sprintf("%s#%d", key, k)), State: gates.QuestionPending,
			Execution: r.rec.ID, Step: n.ID, Connection: conn.Name(), Mode: q.Mode, Message: q.Message,
			RequestedSchema: q.RequestedSchema, URL: q.URL, ElicitationID: q.ElicitationID,
			RequestedBy: r.rec.Principal, CreatedAt: now, ExpiresAt: now.Add(r.e.questionHold),
		}
		rec, err := r.e.questions.Ask(ctx, asking)
		if err != nil {
			return connect.Answer{}, r.storage(ctx, err)
		}
		r.update(key, func(st *StepRecord) { st.Question = rec.ID })
		if err := r.save(ctx); err != nil {
			return connect.Answer{}, err
		}
		return r.awaitAnswer(ctx, rec.ID)
	}
}

// declineWhy is why a question is declined without asking anyone, or "".
func declineWhy(p registry.Policy, q connect.Question) string {
	if slices.Contains(p.DeclineQuestions, q.Mode) {
		return fmt.Sprintf("the connection's policy declines %s questions", q.Mode)
	}
	switch q.Mode {
	case "form":
		if err := gates.CheckForm(q.RequestedSchema); err != nil {
			return err.Error()
		}
	case "url":
		if q.URL == "" {
			return "a URL question without a URL"
		}
	default:
		return fmt.Sprintf("unknown question mode %q", q.Mode)
	}
	return ""
}

// awaitAnswer waits for the question to be decided or to expire.
func (r *run) awaitAnswer(ctx context.Context, id string) (connect.Answer, error) {
	t := time.NewTicker(approvalPoll)
	defer t.Stop()
	for {
		q, err := r.e.questions.Get(ctx, id)
		if err != nil {
			return connect.Answer{}, r.storage(ctx, err)
		}
		switch q.State {
		case gates.QuestionAnswered:
			return connect.Answer{Action: connect.AnswerAccept, Content: q.Content}, nil
		case gates.QuestionDeclined:
			return connect.Answer{Action: connect.AnswerDecline}, nil
		case gates.QuestionCancelled, gates.QuestionExpired:
			return connect.Answer{Action: connect.AnswerCancel}, nil
		}
		select {
		case <-ctx.Done():
			return connect.Answer{}, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// answerersOf is whom the policy of connection names as the answerers of
// its server's questions.
func (e *Executions) answerersOf(connection string) []string {
	c, err := e.reg.Get(connection)
	if err != nil {
		return nil
	}
	return c.Policy().Answerers
}

// QuestionObserver is implemented by an Observer that counts questions.
type QuestionObserver interface {
	QuestionEntered(state string)
}

func (e *Executions) observeQuestion(state gates.QuestionState) {
	if o, ok := e.observer.(QuestionObserver); ok {
		o.QuestionEntered(string(state))
	}
}
