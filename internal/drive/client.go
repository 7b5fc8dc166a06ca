package drive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// fileFields are the file properties every answer asks for and a tool
// returns: enough to name, place and open a file, nothing about its
// sharing or owners.
const fileFields = "id,name,mimeType,parents,size,modifiedTime,webViewLink"

// errorExcerpt bounds what a failed answer's error quotes of it.
const errorExcerpt = 512

// call is one tool call: its credential and the requests it sends.
type call struct {
	conn    *conn
	op      string
	headers map[string]string // per-call credentials, or nil
}

// request is one HTTP request to Drive; body is kept as bytes so it can
// be sent again after a refused service-account token is replaced.
type request struct {
	method      string
	url         *url.URL
	body        []byte
	contentType string
	// limit bounds the answer's body.
	limit int64
}

// apiURL is the API base with path segments (escaped here) and a query.
func (cl *call) apiURL(base *url.URL, q url.Values, segments ...string) *url.URL {
	u := *base
	raw := strings.TrimSuffix(base.EscapedPath(), "/")
	plain := strings.TrimSuffix(base.Path, "/")
	for _, s := range segments {
		raw += "/" + url.PathEscape(s)
		plain += "/" + s
	}
	u.RawPath, u.Path = raw, plain
	if q == nil {
		q = url.Values{}
	}
	// Shared Drives (where a service account's files usually live) are
	// only reachable with this flag; on My Drive it changes nothing.
	q.Set("supportsAllDrives", "true")
	u.RawQuery = q.Encode()
	return &u
}

// send sends r with the call's credential and returns the answer's body.
// A non-2xx answer is a *connect.CallError quoting Google's message; a
// 401 on the caller's own token wraps connect.ErrNeedsSignIn (the harness
// refreshes it and calls once more); a 401 on the service account's token
// replaces the token and sends once more.
func (cl *call) send(ctx context.Context, r request) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		hreq, err := cl.httpRequest(ctx, r)
		if err != nil {
			return nil, err
		}
		resp, err := cl.conn.client.Do(hreq)
		if re, ok := credhttp.AsRedirect(err); ok {
			return nil, &connect.CallError{Op: cl.op, Message: re.Error()}
		}
		if err != nil {
			return nil, err
		}
		data, rerr := readBounded(resp.Body, r.limit)
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized {
			if cl.headers != nil {
				return nil, fmt.Errorf("drive %s: %s: HTTP 401: %w", cl.conn.provider.name, cl.op, connect.ErrNeedsSignIn)
			}
			if sa := cl.conn.provider.sa; sa != nil && attempt == 0 {
				sa.invalidate()
				continue
			}
		}
		if resp.StatusCode/100 != 2 {
			return nil, &connect.CallError{Op: cl.op, Message: googleError(resp.StatusCode, data)}
		}
		if errors.Is(rerr, errTooLarge) {
			return nil, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("the answer is larger than %d bytes, the most this connection reads", r.limit)}
		}
		if rerr != nil {
			return nil, rerr
		}
		return data, nil
	}
}

func (cl *call) httpRequest(ctx context.Context, r request) (*http.Request, error) {
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	hreq, err := http.NewRequestWithContext(ctx, r.method, r.url.String(), body)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept", "application/json, */*;q=0.5")
	if r.contentType != "" {
		hreq.Header.Set("Content-Type", r.contentType)
	}
	switch {
	case cl.headers != nil:
		// The caller's own credentials, resolved at gate 6.
		for k, v := range cl.headers {
			hreq.Header.Set(k, v)
		}
	case cl.conn.provider.sa != nil:
		tok, err := cl.conn.provider.sa.token(ctx)
		if err != nil {
			return nil, err
		}
		hreq.Header.Set("Authorization", "Bearer "+tok)
	default:
		// Never sent without a credential: Drive would only refuse it.
		return nil, fmt.Errorf("no credentials for this call (sign in with Google for a per-user connection): %w", connect.ErrNeedsSignIn)
	}
	return hreq, nil
}

// sendJSON sends r and decodes a JSON answer into out.
func (cl *call) sendJSON(ctx context.Context, r request, out any) error {
	if r.limit == 0 {
		r.limit = metadataLimit
	}
	data, err := cl.send(ctx, r)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &connect.CallError{Op: cl.op, Message: fmt.Sprintf("Drive answered with something other than the JSON expected: %v", err)}
	}
	return nil
}

// metadataLimit bounds a metadata or listing answer (a 1000-file page
// with our fields is well under it).
const metadataLimit = 4 << 20

// errTooLarge is a body over its bound.
var errTooLarge = errors.New("too large")

// readBounded reads at most limit bytes of r, failing when there is more.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	if limit <= 0 {
		limit = metadataLimit
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return data[:limit], errTooLarge
	}
	return data, nil
}

// googleError is a failed answer as a message: the status, Google's
// reason and message when the body is Google's error shape
// ({"error": {"code", "message", "errors": [{"reason"}]}}), else the start
// of the body.
func googleError(status int, data []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Errors  []struct {
				Reason string `json:"reason"`
			} `json:"errors"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
		reason := ""
		if len(e.Error.Errors) > 0 && e.Error.Errors[0].Reason != "" {
			reason = " " + e.Error.Errors[0].Reason
		}
		return fmt.Sprintf("HTTP %d%s: %s", status, reason, connect.Excerpt(e.Error.Message, errorExcerpt))
	}
	return fmt.Sprintf("HTTP %d: %s", status, connect.Excerpt(string(data), errorExcerpt))
}
