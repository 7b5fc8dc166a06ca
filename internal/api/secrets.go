package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
)

// codeSecretsReadOnly answers PUT /v1/secrets when no writable store is
// configured (no PATCHBAY_SECRET_KEY): secrets then come only from the
// environment or files.
const codeSecretsReadOnly = "SECRETS_READ_ONLY"

// putSecret stores a secret's value. The route is write-only: no route
// returns a value, and neither the value nor its length appears in a
// response, a problem or a log line.
func (h *handlers) putSecret(c echo.Context) error {
	if h.Secrets == nil {
		return problem(http.StatusNotImplemented, codeSecretsReadOnly,
			"no writable secret store is configured; set PATCHBAY_SECRET_KEY to keep secrets in Redis")
	}
	name := c.Param("name")
	if !secrets.ValidSecretName(name) {
		return fieldProblem(fault.CodeValidationFailed, "name", "must be 1 to 128 letters, digits, '.', '_' or '-'")
	}
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	value, err := decodeSecret(body)
	if err != nil {
		return err
	}
	if err := h.Secrets.Put(c.Request().Context(), name, value); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// decodeSecret reads {"value": "..."}. Messages never quote the body.
func decodeSecret(body []byte) (string, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return "", malformed(err)
	}
	problems := unknownMembers(fields, "value")
	bad := func(path, msg string) {
		problems = append(problems, fault.FieldError{Path: path, Code: fault.CodeValidationFailed, Message: msg})
	}
	var value string
	raw, ok := fields["value"]
	switch {
	case !ok:
		bad("/value", "is required")
	case json.Unmarshal(raw, &value) != nil:
		bad("/value", "must be a string")
	case len(value) < secrets.MinSecretSize:
		bad("/value", fmt.Sprintf("must be at least %d bytes: a shorter value cannot be redacted from output without destroying ordinary text", secrets.MinSecretSize))
	case len(value) > secrets.MaxSecretSize:
		bad("/value", fmt.Sprintf("must be at most %d bytes", secrets.MaxSecretSize))
	}
	if len(problems) > 0 {
		return "", problem(http.StatusUnprocessableEntity, codeValidationFailed, "the request has invalid fields", problems...)
	}
	return value, nil
}
