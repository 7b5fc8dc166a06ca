package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// The questions upstream servers ask (MCP elicitations): listed, read and
// decided as approvals are. Every question leaves through
// Questions.Redacted, so an answer's content is shown scrubbed of
// secrets; it is never logged.

type questionList struct {
	Items []*gates.Question `json:"items"`
}

// maxReason bounds the reason a person gives for declining.
const maxReason = 2000

func questionProblem(err error) error {
	switch {
	case errors.Is(err, gates.ErrQuestionNotFound):
		return problem(http.StatusNotFound, "QUESTION_NOT_FOUND", "no question with that id")
	case errors.Is(err, gates.ErrQuestionDecided):
		return problem(http.StatusConflict, "QUESTION_DECIDED", err.Error())
	case errors.Is(err, gates.ErrSelfAnswer):
		return problem(http.StatusConflict, "QUESTION_SELF", "the key whose execution asked cannot answer this question unless the connection's answerers name it; another answerer must")
	case errors.Is(err, gates.ErrNotAnswerer):
		return forbidden("%s", err.Error())
	}
	return err
}

// seesQuestion: the questions its own executions asked, those its approve
// role reaches, any with read, and any it may answer (a key the
// connection's answerers name).
func (h *handlers) seesQuestion(p authz.Principal, qu *gates.Question) bool {
	return p.SeesQuestion(qu.RequestedBy, qu.Connection) || h.Questions.MayAnswer(qu, p)
}

// seenQuestion returns the question if the request's key may see it;
// others are not found, as is every question when no queue is wired.
func (h *handlers) seenQuestion(c echo.Context, id string) (*gates.Question, error) {
	if h.Questions == nil {
		return nil, fmt.Errorf("question %s: %w", id, gates.ErrQuestionNotFound)
	}
	qu, err := h.Questions.Get(c.Request().Context(), id)
	if err != nil {
		return nil, err
	}
	if !h.seesQuestion(principal(c), qu) {
		return nil, fmt.Errorf("question %s: %w", id, gates.ErrQuestionNotFound)
	}
	return qu, nil
}

func (h *handlers) listQuestions(c echo.Context) error {
	state := gates.QuestionState(c.QueryParam("state"))
	switch state {
	case "", gates.QuestionPending, gates.QuestionAnswered, gates.QuestionDeclined, gates.QuestionCancelled, gates.QuestionExpired:
	default:
		return fieldProblem(fault.CodeValidationFailed, "state", "must be one of pending, answered, declined, cancelled, expired")
	}
	limit := 50
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > gates.MaxQuestionList {
			return fieldProblem(fault.CodeValidationFailed, "limit", "must be a whole number from 1 to 200")
		}
		limit = n
	}
	out := questionList{Items: []*gates.Question{}}
	if h.Questions == nil {
		return c.JSON(http.StatusOK, out)
	}
	p := principal(c)
	items, err := h.Questions.ListWhere(c.Request().Context(), state, limit, func(qu *gates.Question) bool {
		return h.seesQuestion(p, qu)
	})
	if err != nil {
		return err
	}
	for _, qu := range items {
		out.Items = append(out.Items, h.Questions.Redacted(qu))
	}
	return c.JSON(http.StatusOK, out)
}

func (h *handlers) getQuestion(c echo.Context) error {
	qu, err := h.seenQuestion(c, c.Param("id"))
	if err != nil {
		return questionProblem(err)
	}
	return c.JSON(http.StatusOK, h.Questions.Redacted(qu))
}

// answerQuestion accepts a question: {"content": {...}} for a form,
// checked against its schema (422 naming each field under /content);
// nothing, {} or {"content": {}} for a URL question, meaning the person
// did what the URL asked.
func (h *handlers) answerQuestion(c echo.Context) error {
	var body struct {
		Content map[string]any `json:"content"`
	}
	if err := decodeOptional(c, &body); err != nil {
		return err
	}
	return h.decideQuestion(c, func(ctx context.Context, id string, p authz.Principal) (*gates.Question, error) {
		return h.Questions.Answer(ctx, id, p, body.Content)
	})
}

// declineQuestion declines a question: {"reason"?: string}.
func (h *handlers) declineQuestion(c echo.Context) error {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeOptional(c, &body); err != nil {
		return err
	}
	if len(body.Reason) > maxReason {
		return fieldProblem(fault.CodeValidationFailed, "/reason", "must be at most 2000 characters")
	}
	return h.decideQuestion(c, func(ctx context.Context, id string, p authz.Principal) (*gates.Question, error) {
		return h.Questions.Decline(ctx, id, p, body.Reason)
	})
}

// cancelQuestion dismisses a question without a choice; the body, if
// any, is {}.
func (h *handlers) cancelQuestion(c echo.Context) error {
	var body struct{}
	if err := decodeOptional(c, &body); err != nil {
		return err
	}
	return h.decideQuestion(c, func(ctx context.Context, id string, p authz.Principal) (*gates.Question, error) {
		return h.Questions.Cancel(ctx, id, p)
	})
}

// decideQuestion runs one decision on a question the key may see (404
// otherwise, before anything is said about who may decide it).
func (h *handlers) decideQuestion(c echo.Context, decide func(context.Context, string, authz.Principal) (*gates.Question, error)) error {
	id := c.Param("id")
	if _, err := h.seenQuestion(c, id); err != nil {
		return questionProblem(err)
	}
	qu, err := decide(c.Request().Context(), id, principal(c))
	if err != nil {
		return questionProblem(err)
	}
	return c.JSON(http.StatusOK, h.Questions.Redacted(qu))
}

// decodeOptional decodes a body that may be absent into dst, closed as
// decodeClosed does.
func decodeOptional(c echo.Context, dst any) error {
	if c.Request().ContentLength == 0 {
		return nil
	}
	raw, err := readJSONBody(c)
	if err != nil {
		return err
	}
	if len(raw) == 0 {
		return nil
	}
	return decodeClosed(raw, dst)
}
