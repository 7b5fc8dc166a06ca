package githubapp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// What GitHub's REST API asks every client to send.
const (
	apiVersion   = "2022-11-28"
	acceptHeader = "application/vnd.github+json"
	maxBody      = 1 << 20
)

// grant is GitHub's answer to an installation token exchange.
type grant struct {
	Token        string            `json:"token"`
	ExpiresAt    time.Time         `json:"expires_at"`
	Permissions  map[string]string `json:"permissions"`
	Repositories []struct {
		Name string `json:"name"`
	} `json:"repositories"`
}

// response is what send read back.
type response struct {
	status int
	header http.Header
	body   []byte
}

// exchange mints a token for a normalized scope: an App JWT, the
// repository's installation, then the installation token narrowed to the
// repository and the permissions, checked against what was asked.
func (s *Source) exchange(ctx context.Context, sc Scope) (grant, error) {
	appJWT, err := AppJWT(s.appID, s.key, s.now())
	if err != nil {
		return grant{}, err
	}
	s.redact(appJWT)
	id, err := s.installation(ctx, appJWT, sc)
	if err != nil {
		return grant{}, err
	}
	return s.accessToken(ctx, appJWT, id, sc)
}

// installation looks up the id of the installation that covers the
// repository (GET /repos/{owner}/{repo}/installation).
func (s *Source) installation(ctx context.Context, appJWT string, sc Scope) (int64, error) {
	resp, err := s.send(ctx, http.MethodGet, "/repos/"+sc.Owner+"/"+sc.Repo+"/installation", appJWT, nil)
	if err != nil {
		return 0, err
	}
	if resp.status != http.StatusOK {
		return 0, s.classify(resp, "look up the installation of "+sc.Owner+"/"+sc.Repo)
	}
	var inst struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal(resp.body, &inst); err != nil || inst.ID <= 0 {
		return 0, &Error{Code: HTTP, Status: resp.status, Message: "the installation lookup answered without an installation id"}
	}
	return inst.ID, nil
}

// accessToken exchanges the App JWT for an installation token
// (POST /app/installations/{id}/access_tokens) and fails closed unless
// GitHub granted every permission asked for, for this repository.
func (s *Source) accessToken(ctx context.Context, appJWT string, id int64, sc Scope) (grant, error) {
	body, err := json.Marshal(map[string]any{"repositories": []string{sc.Repo}, "permissions": sc.Permissions})
	if err != nil {
		return grant{}, fmt.Errorf("githubapp: encode the exchange: %w", err)
	}
	resp, err := s.send(ctx, http.MethodPost, "/app/installations/"+strconv.FormatInt(id, 10)+"/access_tokens", appJWT, body)
	if err != nil {
		return grant{}, err
	}
	if resp.status != http.StatusCreated && resp.status != http.StatusOK {
		return grant{}, s.classify(resp, "exchange for an installation token of "+sc.Owner+"/"+sc.Repo)
	}
	var g grant
	if err := json.Unmarshal(resp.body, &g); err != nil || g.Token == "" || g.ExpiresAt.IsZero() {
		return grant{}, &Error{Code: HTTP, Status: resp.status, Message: "the token exchange answered without a token and its expiry"}
	}
	s.redact(g.Token)
	if short := missing(sc.Permissions, g.Permissions); len(short) > 0 {
		return grant{}, &Error{Code: PermissionDenied, Status: resp.status, Message: "GitHub granted less than asked for " + sc.Owner + "/" + sc.Repo + ", missing " + strings.Join(short, ", ")}
	}
	if !coversOnly(g, sc.Repo) {
		return grant{}, &Error{Code: PermissionDenied, Status: resp.status, Message: "GitHub granted a token for other repositories than " + sc.Owner + "/" + sc.Repo}
	}
	return g, nil
}

// coversOnly reports whether a grant that lists its repositories lists
// exactly repo (GitHub compares names without case).
func coversOnly(g grant, repo string) bool {
	if g.Repositories == nil {
		return true
	}
	return len(g.Repositories) == 1 && strings.EqualFold(g.Repositories[0].Name, repo)
}

// send makes one request to the API with the App JWT. A failure to get a
// response is a network Error.
func (s *Source) send(ctx context.Context, method, path, appJWT string, body []byte) (response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.apiBase+path, bytes.NewReader(body))
	if err != nil {
		return response{}, errorf(InvalidRequest, "build the request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+appJWT)
	req.Header.Set("Accept", acceptHeader)
	req.Header.Set("X-GitHub-Api-Version", apiVersion)
	req.Header.Set("User-Agent", s.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := s.http.Do(req)
	if re, ok := credhttp.AsRedirect(err); ok {
		return response{}, &Error{Code: HTTP, Message: method + " " + s.apiBase + path + ": " + re.Error()}
	}
	if err != nil {
		return response{}, &Error{Code: Network, Message: method + " " + s.apiBase + path, Err: err}
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return response{}, &Error{Code: Network, Status: res.StatusCode, Message: "read the response to " + method + " " + s.apiBase + path, Err: err}
	}
	return response{status: res.StatusCode, header: res.Header, body: data}, nil
}

// classify turns an error response into an Error. Rate limits come
// first: GitHub answers them with 403 as well as 429.
func (s *Source) classify(resp response, what string) *Error {
	msg := githubMessage(resp)
	e := &Error{Status: resp.status, Message: what}
	if msg != "" {
		e.Message += ": " + clipTo(msg, 200)
	}
	lower := strings.ToLower(msg)
	switch {
	case s.rateLimited(resp, lower, e):
		e.Code = RateLimited
	case resp.status == http.StatusUnauthorized:
		e.Code = Unauthorized
	case resp.status == http.StatusNotFound:
		e.Code = NotInstalled
	case resp.status == http.StatusForbidden:
		e.Code = PermissionDenied
	case resp.status == http.StatusUnprocessableEntity && strings.Contains(lower, "permission"):
		e.Code = PermissionDenied
	case resp.status == http.StatusUnprocessableEntity && strings.Contains(lower, "repositor"):
		e.Code = NotInstalled
	default:
		e.Code = HTTP
	}
	return e
}

// rateLimited recognises GitHub's primary limit (x-ratelimit-remaining: 0,
// wait until x-ratelimit-reset) and secondary limits (retry-after, or a
// message naming the limit) and sets e.RetryAfter when GitHub said.
func (s *Source) rateLimited(resp response, lowerMsg string, e *Error) bool {
	if resp.status != http.StatusForbidden && resp.status != http.StatusTooManyRequests {
		return false
	}
	h := resp.header
	retry, hasRetry := retryAfter(h.Get("Retry-After"), s.now())
	exhausted := h.Get("X-Ratelimit-Remaining") == "0"
	if !hasRetry && !exhausted && resp.status != http.StatusTooManyRequests && !strings.Contains(lowerMsg, "rate limit") {
		return false
	}
	switch {
	case hasRetry:
		e.RetryAfter = retry
	case exhausted:
		if reset, err := strconv.ParseInt(h.Get("X-Ratelimit-Reset"), 10, 64); err == nil {
			e.RetryAfter = max(time.Unix(reset, 0).Sub(s.now()).Round(time.Second), time.Second)
		}
	}
	return true
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now).Round(time.Second), 0), true
	}
	return 0, false
}

// githubMessage is what a GitHub error body says: its message (and the
// first of its errors), an OAuth-shaped error's code and description, or
// the start of a text body — on one line, without anything shaped like
// a JWT.
// "" when it says nothing readable (the status is in the Error).
func githubMessage(resp response) string {
	r := credhttp.ParseRefusal(resp.status, resp.header.Get("Content-Type"), resp.body)
	if r.Code == "" && r.Description == "" {
		return ""
	}
	return r.String()
}
