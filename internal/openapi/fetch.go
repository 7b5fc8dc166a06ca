package openapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// fetchDocument reads the document from its file or URL. It returns the
// URL the document was finally read from (nil for a file), against which
// a relative servers[0].url is resolved.
func (p *Provider) fetchDocument(ctx context.Context) ([]byte, *url.URL, error) {
	raw := p.spec.URL
	if !strings.Contains(raw, "://") || strings.HasPrefix(raw, "file://") {
		path := strings.TrimPrefix(raw, "file://")
		data, err := p.opts.ReadFile(filepath.Clean(path))
		if err == nil && int64(len(data)) > p.maxBytes() {
			err = fmt.Errorf("larger than %d bytes (maxResponseBytes)", p.maxBytes())
		}
		if err != nil {
			return nil, nil, fmt.Errorf("openapi %s: read document: %w", p.name, err)
		}
		return data, nil, nil
	}
	docURL, err := url.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("openapi %s: document url: %w", p.name, err)
	}
	withCreds := p.docAuth(docURL)
	if to := p.opts.CredentialsOnlyTo; withCreds && p.opts.Shared != nil && to != "" && !credhttp.SameOrigin(raw, to) {
		return nil, nil, fmt.Errorf("openapi %s: docAuth would send the GitHub App's token to the document at %s, but its tokens go only to its apiBaseUrl %s: read the document without it (docAuth: false) or from that origin", p.name, redactURL(raw), redactURL(to))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("openapi %s: document request: %w", p.name, err)
	}
	req.Header.Set("Accept", "application/json, application/yaml;q=0.9, */*;q=0.5")
	signInMissing := false
	if withCreds {
		headers, err := p.headers(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("openapi %s: document request: %w", p.name, err)
		}
		shared, missing, err := p.sharedHeaders(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("openapi %s: document request: %w", p.name, err)
		}
		signInMissing = missing
		for k, v := range shared {
			headers[k] = v
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
	}
	// Credentials belong to the document's origin: a redirect elsewhere
	// is followed without them (documents move to CDNs).
	resp, err := credhttp.Client(p.opts.HTTPClient, credhttp.FollowAnyOrigin).Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("openapi %s: fetch document: %w", p.name, err)
	}
	defer resp.Body.Close()
	final := resp.Request.URL
	if resp.StatusCode == http.StatusUnauthorized && signInMissing && credhttp.Origin(final) == credhttp.Origin(docURL) {
		// The document wants the credential nobody has signed in for yet.
		return nil, nil, fmt.Errorf("openapi %s: fetch document: HTTP 401 and no shared sign-in: %w", p.name, connect.ErrNeedsSignIn)
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return nil, nil, fmt.Errorf("openapi %s: fetch document: HTTP %d: %s", p.name, resp.StatusCode, p.docAuthHint(withCreds, docURL, final))
	}
	if resp.StatusCode/100 != 2 {
		return nil, nil, fmt.Errorf("openapi %s: fetch document: HTTP %d", p.name, resp.StatusCode)
	}
	data, err := readBounded(resp.Body, p.maxBytes())
	if err != nil {
		return nil, nil, fmt.Errorf("openapi %s: read document: %w", p.name, err)
	}
	return data, final, nil
}

// sharedHeaders is the shared sign-in's credential for the document
// request; missing is true when the entry signs in but nobody has yet
// (the document may still be public).
func (p *Provider) sharedHeaders(ctx context.Context) (headers map[string]string, missing bool, err error) {
	if p.opts.Shared == nil {
		return nil, false, nil
	}
	h, ok, err := p.opts.Shared.SharedHeaders(ctx, p.name)
	switch {
	case errors.Is(err, connect.ErrNeedsSignIn):
		return nil, true, nil
	case err != nil:
		return nil, false, err
	case !ok:
		return nil, false, nil
	}
	if p.opts.Redactor != nil {
		for _, v := range h {
			p.opts.Redactor.Add(v)
		}
	}
	return h, false, nil
}

// docAuth says whether the configured headers go with the document
// request: docAuth when set, else only when baseUrl shares the document's
// origin (the document is then part of the API the credentials are for).
func (p *Provider) docAuth(docURL *url.URL) bool {
	if p.spec.DocAuth != nil {
		return *p.spec.DocAuth
	}
	if p.spec.BaseURL == "" {
		return false
	}
	base, err := url.Parse(p.spec.BaseURL)
	return err == nil && credhttp.Origin(base) == credhttp.Origin(docURL)
}

// docAuthHint says which fix applies to a document refused with 401 or
// 403.
func (p *Provider) docAuthHint(sent bool, docURL, final *url.URL) string {
	switch {
	case credhttp.Origin(final) != credhttp.Origin(docURL):
		return fmt.Sprintf("the document redirected to %s, another origin, and credentials do not follow a redirect: point url at the final location", redactURL(final.String()))
	case sent:
		return "the document's server refused the configured headers"
	case len(p.spec.Headers) == 0 && p.opts.Shared == nil:
		return "the document needs credentials, and the connection has no headers or auth"
	case p.spec.DocAuth != nil && !*p.spec.DocAuth:
		return "the document was fetched without credentials (docAuth: false): set docAuth: true to send the headers with it"
	default:
		return "the document was fetched without credentials, which go with it only when baseUrl has the document's origin: set baseUrl, or docAuth: true"
	}
}
