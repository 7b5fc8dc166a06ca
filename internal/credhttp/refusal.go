package credhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"unicode"

	"golang.org/x/oauth2"
)

// maxText bounds the code and the description a refusal carries.
const maxText = 300

// Refusal is what a token endpoint (or an API refusing a credential)
// answered: an OAuth error code and description (RFC 6749 §5.2), or the
// like read from another shape of error body.
type Refusal struct {
	// Status is the HTTP status, 0 when unknown.
	Status      int
	Code        string
	Description string
}

// String is the refusal in words: "invalid_grant: Invalid JWT
// Signature.", the description alone without a code, or "HTTP 400"
// when the body said nothing readable.
func (r Refusal) String() string {
	switch {
	case r.Code != "" && r.Description != "":
		return r.Code + ": " + r.Description
	case r.Code != "":
		return r.Code
	case r.Description != "":
		return r.Description
	case r.Status != 0:
		return fmt.Sprintf("HTTP %d %s", r.Status, http.StatusText(r.Status))
	default:
		return "the token endpoint refused"
	}
}

// RefusalOf returns the refusal inside err, an *oauth2.RetrieveError:
// the code and description x/oauth2 read, else those parsed from the
// body it kept (x/oauth2/jwt fills in only the body, and x/oauth2 reads a
// JSON body sent as text/plain as a form).
func RefusalOf(err error) (Refusal, bool) {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		return Refusal{}, false
	}
	r := Refusal{Code: clean(re.ErrorCode), Description: clean(re.ErrorDescription)}
	status, contentType := 0, ""
	if re.Response != nil {
		status, contentType = re.Response.StatusCode, re.Response.Header.Get("Content-Type")
	}
	r.Status = status
	if r.Code == "" && r.Description == "" {
		r = ParseRefusal(status, contentType, re.Body)
	}
	return r, true
}

// DescribeTokenError is a token request's failure in words: the refusal
// when the endpoint answered, else why it did not (without the URL,
// which may carry a query).
func DescribeTokenError(err error) string {
	if r, ok := RefusalOf(err); ok {
		return r.String()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		if re, ok := AsRedirect(ue.Err); ok {
			return re.Error()
		}
		return clean(ue.Err.Error())
	}
	return clean(err.Error())
}

// ParseRefusal reads an error body of any common shape: OAuth's
// {"error", "error_description"} (as JSON or a form), Google's
// {"error": {"code", "message", "status"}}, GitHub's {"message",
// "errors"}, or a short text. What it returns is clipped, on one line,
// and stripped of anything shaped like a JWT; the caller's redactor
// removes the secrets it knows.
func ParseRefusal(status int, contentType string, body []byte) Refusal {
	r := Refusal{Status: status}
	body = bytes.TrimSpace(body)
	var m map[string]any
	switch {
	case len(body) > 0 && body[0] == '{' && json.Unmarshal(body, &m) == nil:
		r.Code, r.Description = fromJSON(m)
	case isForm(contentType, body):
		if v, err := url.ParseQuery(string(body)); err == nil {
			r.Code, r.Description = v.Get("error"), v.Get("error_description")
		}
	case len(body) > 0 && body[0] != '<':
		// Text, not an HTML error page.
		r.Description = string(body)
	}
	r.Code, r.Description = clean(r.Code), clean(r.Description)
	return r
}

func isForm(contentType string, body []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return mt == "application/x-www-form-urlencoded" || bytes.HasPrefix(body, []byte("error="))
}

// fromJSON reads the code and description of a JSON error body.
func fromJSON(m map[string]any) (code, desc string) {
	switch e := m["error"].(type) {
	case string:
		desc, _ = m["error_description"].(string)
		return e, desc
	case map[string]any:
		// Google APIs: {"code": 400, "message": …, "status":
		// "INVALID_ARGUMENT", "errors": [{"reason": …}]}.
		code, _ = e["status"].(string)
		if errs, ok := e["errors"].([]any); ok && len(errs) > 0 {
			if first, ok := errs[0].(map[string]any); ok {
				if reason, _ := first["reason"].(string); reason != "" {
					code = reason
				}
			}
		}
		desc, _ = e["message"].(string)
		return code, desc
	}
	// GitHub: {"message": …, "errors": [{"code", "field", "message"}]}.
	desc, _ = m["message"].(string)
	if errs, ok := m["errors"].([]any); ok && len(errs) > 0 {
		if first, ok := errs[0].(map[string]any); ok {
			code, _ = first["code"].(string)
			if more, _ := first["message"].(string); more != "" && more != desc {
				desc = strings.TrimSpace(desc + " (" + more + ")")
			}
		}
	}
	return code, desc
}

var (
	// jwtRE matches a compact JWS/JWT: an assertion or token some
	// servers echo in their error descriptions.
	jwtRE = regexp.MustCompile(`[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`)
	// pemRE matches a PEM block (a private key), which the redactor
	// would no longer recognise once put on one line.
	pemRE = regexp.MustCompile(`(?s)-----BEGIN [A-Z0-9 ]+-----.*?(-----END [A-Z0-9 ]+-----|$)`)
)

// clean puts upstream text on one line (it goes into messages and log
// lines), clips it and removes JWT- and PEM-shaped strings.
func clean(s string) string {
	s = pemRE.ReplaceAllString(s, "<redacted>")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	s = jwtRE.ReplaceAllString(s, "<redacted>")
	if r := []rune(s); len(r) > maxText {
		s = string(r[:maxText]) + "…"
	}
	return s
}
