package bearer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// fetcher makes the verifier's requests: bounded in time and size, and
// following redirects only within the first request's origin (GET and
// HEAD only, so the introspection POST, which carries a token, goes only
// where it was addressed).
type fetcher struct {
	client *http.Client
}

func newFetcher(c *http.Client) *fetcher {
	if c == nil {
		c = &http.Client{Timeout: fetchTimeout}
	}
	return &fetcher{client: credhttp.Client(c, credhttp.FollowSameOrigin)}
}

// do sends req and decodes a JSON body of at most maxDocument bytes into
// v, whatever the status, which it returns. A body that is not JSON is
// an error only for a 200.
func (f *fetcher) do(req *http.Request, v any) (int, error) {
	ctx, cancel := context.WithTimeout(req.Context(), fetchTimeout)
	defer cancel()
	req = req.WithContext(ctx)
	req.Header.Set("Accept", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, describe(req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocument+1))
	switch {
	case err != nil:
		return resp.StatusCode, fmt.Errorf("%s: reading the answer: %w", credhttp.Show(req.URL), err)
	case len(body) > maxDocument:
		return resp.StatusCode, fmt.Errorf("%s: the answer is larger than %d bytes", credhttp.Show(req.URL), maxDocument)
	}
	if err := json.Unmarshal(body, v); err != nil && resp.StatusCode == http.StatusOK {
		return resp.StatusCode, fmt.Errorf("%s: the answer is not the JSON expected: %w", credhttp.Show(req.URL), err)
	}
	return resp.StatusCode, nil
}

// getJSON GETs u into v.
func (f *fetcher) getJSON(ctx context.Context, u string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	return f.do(req, v)
}

// describe is a request's failure without its URL's query (the error of
// net/http quotes the whole URL).
func describe(u *url.URL, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if re, ok := credhttp.AsRedirect(err); ok {
		return re
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: no answer within %s", credhttp.Show(u), fetchTimeout)
	}
	return fmt.Errorf("%s: %w", credhttp.Show(u), err)
}
