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

// Questions from servers (MCP elicitation), as the engine answers them,
// in the question queue (gates.Questions), as durable records a person
// answers through the API or the admin UI:
//   - A server that asks in its answer (a 2026-07-28 input_required
//     result) parks the run: the call fails with *connect.InputRequired
//     (its CallRequest.Park is set), the questions are recorded and the
//     step's entry keeps the server's requestState (Input); the execution
//     waits, no worker held. Once every question is decided, their answers
//     resume it on any replica, and the call is sent again with the
//     answers and the state (CallRequest.Resume), once.
//   - A server that asks while it holds its request open (a 2025-era
//     elicitation/create) is answered through the call's Asker, which
//     holds the call (and its worker) up to the question's deadline
//     (QuestionHold); past it the question expires and the server is told
//     "decline".
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
	var a connect.Answer
	err := pollUntil(ctx, func() (bool, error) {
		q, err := r.e.questions.Get(ctx, id)
		if err != nil {
			return false, r.storage(ctx, err)
		}
		var decided bool
		a, decided = answerOf(q)
		return decided, nil
	})
	if err != nil {
		return connect.Answer{}, err
	}
	return a, nil
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

// maxInputRounds bounds how often one call is answered questions in its
// answer and sent again.
const maxInputRounds = 3

// InputWait is a call parked on the questions its server asked in its
// answer (a 2026-07-28 input_required result): the state to send back,
// the queue's question for each of the server's question ids, and the
// answers given without asking anyone.
type InputWait struct {
	RequestState string                    `json:"requestState"`
	Questions    map[string]string         `json:"questions,omitempty"`
	Answered     map[string]connect.Answer `json:"answered,omitempty"`
}

// parkOnInput answers at once the questions nobody need see (declined by
// policy or for asking a secret) and returns the resume when that is all
// of them; otherwise it records the others in the queue and in the
// step's entry, and parks the run (errWaiting). Their answers resume it
// (inputAnswered), on any replica, after a restart too.
func (r *run) parkOnInput(ctx context.Context, n *document.Node, key string, conn *registry.Connection, ir *connect.InputRequired) (*connect.InputResume, error) {
	w := &InputWait{RequestState: ir.RequestState, Questions: map[string]string{}, Answered: map[string]connect.Answer{}}
	now := time.Now().UTC()
	for _, qid := range document.SortedKeys(ir.Questions) {
		q := ir.Questions[qid]
		if why := declineWhy(conn.Policy(), q); why != "" {
			r.e.emit(ctx, r.rec.ID, EventQuestionDeclined, map[string]any{"step": n.ID, "connection": conn.Name(), "mode": q.Mode, "reason": why})
			r.e.observeQuestion(gates.QuestionDeclined)
			w.Answered[qid] = connect.Answer{Action: connect.AnswerDecline}
			continue
		}
		rec, err := r.e.questions.Ask(ctx, &gates.Question{
			ID: gates.QuestionID(r.rec.ID, key+"#"+qid+"@"+ir.RequestState), State: gates.QuestionPending,
			Execution: r.rec.ID, Step: n.ID, Connection: conn.Name(), Mode: q.Mode, Message: q.Message,
			RequestedSchema: q.RequestedSchema, URL: q.URL, ElicitationID: q.ElicitationID,
			RequestedBy: r.rec.Principal, CreatedAt: now, ExpiresAt: now.Add(r.e.approvalTTL),
		})
		if err != nil {
			return nil, r.storage(ctx, err)
		}
		w.Questions[qid] = rec.ID
	}
	if len(w.Questions) == 0 {
		return &connect.InputResume{RequestState: w.RequestState, Answers: w.Answered}, nil
	}
	first := w.Questions[document.SortedKeys(w.Questions)[0]]
	r.update(key, func(st *StepRecord) { st.Status, st.Input, st.Question = StepWaiting, w, first })
	if err := r.save(ctx); err != nil {
		return nil, err
	}
	return nil, errWaiting
}

// inputAnswered is the resume of a call parked on questions once every
// one is decided, nil when the call is not parked, and errWaiting while
// one still waits.
func (r *run) inputAnswered(ctx context.Context, key string) (*connect.InputResume, error) {
	r.mu.Lock()
	var w *InputWait
	if i := r.entry(key); i >= 0 {
		w = r.rec.Steps[i].Input
	}
	r.mu.Unlock()
	if w == nil {
		return nil, nil
	}
	out := &connect.InputResume{RequestState: w.RequestState, Answers: map[string]connect.Answer{}}
	for qid, a := range w.Answered {
		out.Answers[qid] = a
	}
	for qid, id := range w.Questions {
		q, err := r.e.questions.Get(ctx, id)
		if err != nil {
			return nil, r.storage(ctx, err)
		}
		a, decided := answerOf(q)
		if !decided {
			r.update(key, func(st *StepRecord) { st.Status = StepWaiting })
			return nil, errWaiting
		}
		out.Answers[qid] = a
	}
	return out, nil
}

// answerOf is a decided question's answer to its server.
func answerOf(q *gates.Question) (connect.Answer, bool) {
	switch q.State {
	case gates.QuestionAnswered:
		return connect.Answer{Action: connect.AnswerAccept, Content: q.Content}, true
	case gates.QuestionDeclined, gates.QuestionExpired:
		// Nobody answered in time: declined, and the question.expired
		// event says why.
		return connect.Answer{Action: connect.AnswerDecline}, true
	case gates.QuestionCancelled:
		return connect.Answer{Action: connect.AnswerCancel}, true
	}
	return connect.Answer{}, false
}
