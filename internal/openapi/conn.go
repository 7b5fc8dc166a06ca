package openapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// conn is a loaded document: calls go straight to the API, so there is
// no session to keep and nothing to close.
type conn struct {
	provider *Provider
	base     *url.URL
	// client sends the calls, following redirects as the entry says.
	client *http.Client
	// credErr is why credentials may not go to base, nil when they may.
	credErr  error
	manifest connect.Manifest
	ops      map[string]operation
	identity connect.Identity
	info     map[string]any
}

func (c *conn) Manifest() connect.Manifest { return c.manifest }
func (c *conn) Identity() connect.Identity { return c.identity }
func (c *conn) Info() map[string]any       { return maps.Clone(c.info) }
func (c *conn) Close() error               { return nil }

// Call sends one operation's request. Arguments have passed gate 2 against
// the operation's schema; secrets in them are filled in.
func (c *conn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	op, ok := c.ops[req.Op]
	if !ok {
		return nil, fmt.Errorf("%w: %s", connect.ErrUnknownOperation, req.Op)
	}
	p := c.provider
	if c.credErr != nil && len(req.Headers) > 0 {
		return nil, fmt.Errorf("openapi %s: %s: %w", p.name, req.Op, c.credErr)
	}
	timeout := DefaultRequestTimeout
	if p.spec.RequestTimeoutMs > 0 {
		timeout = time.Duration(p.spec.RequestTimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	headers, err := p.headers(ctx)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %s: %w", p.name, req.Op, err)
	}
	hreq, err := c.request(ctx, op, req, headers)
	if err != nil {
		return nil, &connect.CallError{Op: req.Op, Message: err.Error()}
	}
	traceRequest(ctx, hreq, op)
	resp, err := c.client.Do(hreq)
	if err != nil {
		if re, ok := credhttp.AsRedirect(err); ok {
			// The API's own answer, as a 4xx would be.
			return nil, &connect.CallError{Op: req.Op, Message: re.Error()}
		}
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("openapi %s: %s: no answer within %s: %w", p.name, req.Op, timeout, err)
		}
		return nil, fmt.Errorf("openapi %s: %s: %w", p.name, req.Op, err)
	}
	defer resp.Body.Close()
	traceResponse(ctx, resp.StatusCode)
	data, err := readBounded(resp.Body, p.maxBytes())
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %s: read response: %w", p.name, req.Op, err)
	}
	if resp.StatusCode == http.StatusUnauthorized && req.Headers != nil {
		// Per-call credentials the API refused: the harness may refresh
		// them and send the call once more.
		return nil, fmt.Errorf("openapi %s: %s: HTTP 401: %w", p.name, req.Op, connect.ErrNeedsSignIn)
	}
	if resp.StatusCode/100 != 2 {
		return nil, &connect.CallError{Op: req.Op, Message: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, connect.Excerpt(string(data), errorExcerpt))}
	}
	return decodeBody(data), nil
}

// request builds the HTTP request of one call.
func (c *conn) request(ctx context.Context, op operation, call connect.CallRequest, configured map[string]string) (*http.Request, error) {
	args := call.Args
	path := op.Path
	query := url.Values{}
	headers := http.Header{}
	// Gate 2 refused these already; checked again where the path is
	// built, for a caller that skipped the gates.
	if err := connect.CheckPathArgs(op.Spec.HTTP, args); err != nil {
		return nil, err
	}
	isParam := map[string]bool{}
	for _, prm := range op.Params {
		isParam[prm.Name] = true
		v, ok := args[prm.Name]
		if !ok || v == nil {
			continue
		}
		switch prm.In {
		case "path":
			path = strings.ReplaceAll(path, "{"+prm.Name+"}", url.PathEscape(scalar(v)))
		case "query":
			addQuery(query, prm, v)
		case "header":
			headers.Set(prm.Name, scalar(v))
		}
	}
	if strings.Contains(path, "{") {
		return nil, fmt.Errorf("path %s has a parameter without a value", op.Path)
	}
	var body []byte
	switch op.BodyMode {
	case bodyMerged:
		rest := map[string]any{}
		for k, v := range args {
			if !isParam[k] {
				rest[k] = v
			}
		}
		if len(rest) > 0 {
			b, err := json.Marshal(rest)
			if err != nil {
				return nil, fmt.Errorf("encode body: %w", err)
			}
			body = b
		}
	case bodyWrapped:
		if v, ok := args[bodyArg]; ok {
			b, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("encode body: %w", err)
			}
			body = b
		}
	}
	// The template's literal segments are URL-safe in practice; values
	// were checked and escaped above, so each stays one segment.
	u := *c.base
	u.RawPath = strings.TrimSuffix(c.base.EscapedPath(), "/") + path
	unescaped, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("path %s: %w", op.Path, err)
	}
	u.Path = unescaped
	if len(query) > 0 {
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += query.Encode()
	}
	var rd *bytes.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	var hreq *http.Request
	if rd != nil {
		hreq, err = http.NewRequestWithContext(ctx, op.Method, u.String(), rd)
	} else {
		hreq, err = http.NewRequestWithContext(ctx, op.Method, u.String(), nil)
	}
	if err != nil {
		return nil, err
	}
	for k, vs := range headers {
		hreq.Header[k] = vs
	}
	hreq.Header.Set("Accept", "application/json, */*;q=0.5")
	if body != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	for k, v := range configured {
		hreq.Header.Set(k, v)
	}
	// Per-call credentials (a principal's token) win over the entry's.
	for k, v := range call.Headers {
		hreq.Header.Set(k, v)
	}
	// The REST convention for dropping a repeated write.
	if call.IdempotencyKey != "" && op.Method != http.MethodGet && op.Method != http.MethodHead {
		hreq.Header.Set("Idempotency-Key", call.IdempotencyKey)
	}
	return hreq, nil
}

// addQuery adds a query parameter with OpenAPI's default style (form):
// arrays repeat the key when exploded and are comma-joined when not;
// objects spread their properties when exploded.
func addQuery(q url.Values, prm param, v any) {
	switch v := v.(type) {
	case []any:
		if prm.Explode {
			for _, x := range v {
				q.Add(prm.Name, scalar(x))
			}
			return
		}
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = scalar(x)
		}
		q.Add(prm.Name, strings.Join(parts, ","))
	case map[string]any:
		if prm.Explode {
			for _, k := range slices.Sorted(maps.Keys(v)) {
				q.Add(k, scalar(v[k]))
			}
			return
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(v)) {
			parts = append(parts, k, scalar(v[k]))
		}
		q.Add(prm.Name, strings.Join(parts, ","))
	default:
		q.Add(prm.Name, scalar(v))
	}
}

// scalar writes one parameter value as the text a URL or header carries.
func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case json.Number:
		return v.String()
	case int, int64:
		return fmt.Sprint(v)
	case nil:
		return ""
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}

// decodeBody is a 2xx body's result: null when empty, the JSON value when
// it is JSON, else the text.
func decodeBody(data []byte) any {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(data, &v); err == nil {
		return v
	}
	return string(data)
}
