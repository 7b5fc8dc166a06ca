package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// maxWait bounds how long POST /v1/executions may hold a request open.
const maxWait = 60 * time.Second

type createRequest struct {
	Workflow json.RawMessage
	// Agent is the shorthand for a one-node document: a model turn.
	Agent json.RawMessage
	Input any
	Wait  time.Duration
}

type links struct {
	Self   string `json:"self"`
	Events string `json:"events"`
}

type executionResponse struct {
	*harness.Execution
	Links links `json:"links"`
}

type acceptedResponse struct {
	ID     string            `json:"id"`
	Status harness.ExecState `json:"status"`
	Links  links             `json:"links"`
}

type executionList struct {
	Items []executionResponse `json:"items"`
	Next  string              `json:"next,omitempty"`
}

func linksOf(id string) links {
	return links{Self: "/v1/executions/" + id, Events: "/v1/executions/" + id + "/events"}
}

func (h *handlers) createExecution(c echo.Context) error {
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	req, err := decodeCreate(body)
	if err != nil {
		return err
	}
	idem, err := idempotencyKey(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	key := principal(c)
	ex, err := h.submitOnce(c, idem, body, func(ctx context.Context, id string) (*harness.Execution, error) {
		if req.Agent != nil {
			return h.Executions.SubmitAgent(ctx, harness.AgentRequest{Agent: req.Agent, Input: req.Input, Principal: key.Name, Allowlist: key.Allowlist, ID: id})
		}
		return h.Executions.Submit(ctx, harness.Request{Workflow: req.Workflow, Input: req.Input, Principal: key.Name, Allowlist: key.Allowlist, ID: id,
			Await: req.Wait > 0})
	})
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, linksOf(ex.ID).Self)
	if req.Wait > 0 {
		if ex, err = h.Executions.Wait(ctx, ex.ID, req.Wait); err != nil {
			return err
		}
		if ex.Status.Terminal() {
			return c.JSON(http.StatusOK, executionResponse{Execution: ex, Links: linksOf(ex.ID)})
		}
	}
	return c.JSON(http.StatusAccepted, acceptedResponse{ID: ex.ID, Status: ex.Status, Links: linksOf(ex.ID)})
}

// readJSONBody reads a request body that must be JSON. curl's -d sends
// application/x-www-form-urlencoded by default; a body sent that way that
// is a JSON object is accepted too, so the README's one-line curl works.
// Browsers cannot exploit this: /v1 needs an Authorization header, which a
// cross-site form cannot set.
func readJSONBody(c echo.Context) ([]byte, error) {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return nil, he
		}
		return nil, problem(http.StatusBadRequest, codeMalformedJSON, "could not read the request body")
	}
	mt, _, _ := mime.ParseMediaType(c.Request().Header.Get(echo.HeaderContentType))
	isJSON := mt == "application/json" || strings.HasSuffix(mt, "+json")
	curlForm := mt == "application/x-www-form-urlencoded" && bytes.HasPrefix(bytes.TrimSpace(body), []byte("{"))
	if !isJSON && !curlForm {
		return nil, problem(http.StatusUnsupportedMediaType, codeUnsupportedMedia,
			fmt.Sprintf("Content-Type must be application/json, not %q", mt))
	}
	return body, nil
}

func decodeCreate(body []byte) (*createRequest, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, malformed(err)
	}
	if err := numbersProblem(body); err != nil {
		return nil, err
	}
	problems := unknownMembers(fields, "workflow", "agent", "input", "wait")
	bad := func(path, msg string) {
		problems = append(problems, fault.FieldError{Path: path, Code: fault.CodeValidationFailed, Message: msg})
	}
	req := &createRequest{Workflow: fields["workflow"], Agent: fields["agent"]}
	isObject := func(raw json.RawMessage) bool { w := bytes.TrimSpace(raw); return len(w) > 0 && w[0] == '{' }
	switch {
	case req.Workflow != nil && req.Agent != nil:
		bad("/agent", "give either workflow or agent, not both")
	case req.Agent != nil:
		if !isObject(req.Agent) {
			bad("/agent", "must be an object: {\"model\": \"<provider>/<model>\", \"instructions\", \"tools\"?, \"output\"?: {\"schema\": …}}")
		}
	case !isObject(req.Workflow):
		bad("/workflow", "is required (or agent) and must be a workflow document (a JSON object)")
	}
	if raw, ok := fields["input"]; ok {
		if err := json.Unmarshal(raw, &req.Input); err != nil {
			bad("/input", "could not be decoded: "+err.Error())
		}
	}
	if raw, ok := fields["wait"]; ok {
		d, err := parseWait(raw)
		if err != nil {
			bad("/wait", err.Error())
		}
		req.Wait = d
	}
	if len(problems) > 0 {
		return nil, problem(http.StatusUnprocessableEntity, codeValidationFailed, "the request has invalid fields", problems...)
	}
	return req, nil
}

// parseWait accepts a Go duration string ("30s") or a number of seconds.
func parseWait(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	var s string
	var secs float64
	switch {
	case json.Unmarshal(raw, &s) == nil:
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("must be a duration such as \"30s\" or a number of seconds")
		}
	case json.Unmarshal(raw, &secs) == nil:
		d = time.Duration(secs * float64(time.Second))
	default:
		return 0, fmt.Errorf("must be a duration such as \"30s\" or a number of seconds")
	}
	if d < 0 || d > maxWait {
		return 0, fmt.Errorf("must be between 0s and %s", maxWait)
	}
	return d, nil
}

func malformed(err error) *Problem {
	detail := "the request body is not valid JSON"
	var se *json.SyntaxError
	if errors.As(err, &se) {
		detail += fmt.Sprintf(" (at byte %d: %s)", se.Offset, se.Error())
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return problem(http.StatusBadRequest, codeMalformedJSON, "the request body must be a JSON object")
	}
	return problem(http.StatusBadRequest, codeMalformedJSON, detail)
}

// visible returns the execution if the request's key may see it: its own,
// or any with read. One it may not see is "not found", as if it did not
// exist, so ids cannot be probed.
func (h *handlers) visible(c echo.Context, id string) (*harness.Execution, error) {
	ex, err := h.Executions.Get(c.Request().Context(), id)
	if err != nil {
		return nil, err
	}
	if !principal(c).Sees(ex.Principal) {
		return nil, fmt.Errorf("execution %s: %w", id, fault.ErrNotFound)
	}
	return ex, nil
}

// actable returns the execution if the request's key may change it
// (cancel, resume): its own with run, any with admin.
func (h *handlers) actable(c echo.Context, id string) (*harness.Execution, error) {
	ex, err := h.visible(c, id)
	if err != nil {
		return nil, err
	}
	if !principal(c).Acts(ex.Principal) {
		return nil, forbidden("only the key that started this execution, or an admin, may change it")
	}
	return ex, nil
}

func (h *handlers) getExecution(c echo.Context) error {
	ex, err := h.visible(c, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, executionResponse{Execution: ex, Links: linksOf(ex.ID)})
}

func (h *handlers) listExecutions(c echo.Context) error {
	opts := harness.ListOptions{Cursor: c.QueryParam("cursor")}
	if p := principal(c); !p.SeesAll() {
		opts.Principal = p.Name
	}
	if s := c.QueryParam("status"); s != "" {
		if !harness.ValidExecState(s) {
			return fieldProblem(fault.CodeValidationFailed, "status", "must be one of queued, running, waiting, succeeded, failed, cancelled")
		}
		opts.Status = harness.ExecState(s)
	}
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return fieldProblem(fault.CodeValidationFailed, "limit", "must be a whole number from 1 to 100")
		}
		opts.Limit = n
	}
	page, err := h.Executions.List(c.Request().Context(), opts)
	if errors.Is(err, harness.ErrBadCursor) {
		return problem(http.StatusBadRequest, codeInvalidCursor, "cursor was not issued by this API")
	}
	if err != nil {
		return err
	}
	out := executionList{Items: make([]executionResponse, len(page.Items)), Next: page.Next}
	for i, ex := range page.Items {
		out.Items[i] = executionResponse{Execution: ex, Links: linksOf(ex.ID)}
	}
	return c.JSON(http.StatusOK, out)
}
