// Package openapi is the OpenAPI provider: a REST API described by an
// OpenAPI 3.0 or 3.1 document (JSON or YAML, from a URL or a file) becomes
// a connection whose operations are the document's path × method pairs,
// or those the entry's include selects by operationId, tag or expression
// (see config.Include).
//
// The document is parsed with github.com/getkin/kin-openapi, which checks
// it is an OpenAPI 3 document; the input schemas are built from the
// document's own JSON so that 3.1 keywords pass through untouched (see
// schema.go). An operation's name is its operationId, or one built from
// method and path (get_pets_petId); its input holds its path, query and
// header parameters and the properties of a JSON request body merged
// beside them (a body that is not a plain object, or that shares a name
// with a parameter, goes whole under "body"). Cookie parameters are left
// out.
//
// A call turns arguments into a request to the base URL (baseUrl, else
// servers[0].url with its variables' defaults, else the document's
// origin) with the configured headers, the per-call credentials the
// harness resolved (an OAuth entry's token: the call's principal's on a
// per-user sign-in, the shared one otherwise), and an Idempotency-Key on
// requests other than GET and HEAD. A 2xx answer returns its JSON (null when empty, the text when not
// JSON); a 401 to a call with per-call credentials wraps
// connect.ErrNeedsSignIn (the harness refreshes the token once); anything
// else is a *connect.CallError with the status and the start of the body,
// which the harness redacts like every error.
//
// The document is read once for everyone, so it only ever carries the
// entry's headers and, with auth, the shared sign-in's token (see
// SharedCredentials), and those only as docAuth allows.
//
// Credentials go where the config says, never where a document or an
// answer says: an entry with headers or auth loads only when its calls go
// to baseUrl or to the origin of the document's configured URL (a
// servers[0].url elsewhere is refused, naming both, until baseUrl says
// so), and a GitHub App's only to its apiBaseUrl's origin
// (Options.CredentialsOnlyTo). Calls follow redirects as followRedirects
// says, under package credhttp's rules: nothing crosses to another
// origin but Accept and User-Agent, and only GET and HEAD are
// redirected. A path parameter that would leave its segment (see
// connect.CheckPathArgs) is refused at gate 2 and checked again here.
//
// Inlined refs multiply, so a small document can describe a huge schema.
// Everything is bounded: the document by maxResponseBytes whether fetched
// or read from a file, and by 64 levels of nesting; what is built from it
// by the entry's budgets (budget.go), counted while inlining: each
// operation's input schema in JSON values and bytes (its refs are inlined
// fewer than three levels deep when that is what fits; one that does not
// fit with none inlined fails the connection), all operations together,
// and their number. A budget error names the operation and the setting.
// Descriptions are cut at 8 KiB and titles at 512 bytes.
package openapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// Defaults of the entry's optional limits.
const (
	DefaultTimeout          = 30 * time.Second
	DefaultRequestTimeout   = 60 * time.Second
	DefaultMaxResponseBytes = 16 << 20
	// WarnOperations is how many operations a connection without include
	// may have before a warning says to choose some: every operation is a
	// tool a model is offered on every turn.
	WarnOperations = 100
	// errorExcerpt is how much of a failed response's body its error
	// carries.
	errorExcerpt = 512
)

// Options are the provider's optional parts; nil means defaults.
type Options struct {
	// HTTPClient sends the document request and the calls; nil is a
	// client of its own. Its redirects follow package credhttp's rules
	// (the entry's followRedirects for calls; any origin, credentials
	// left behind, for the document), and then its own CheckRedirect.
	HTTPClient *http.Client
	Logger     *slog.Logger
	// ReadFile reads a document given as a file path; nil reads at most
	// the entry's maxResponseBytes of it. What it returns is held to that
	// bound too.
	ReadFile func(string) ([]byte, error)
	// Secrets resolves ${secret:NAME} in header values at each call (and
	// for the document request when headers go with it); nil refuses
	// such headers.
	Secrets SecretResolver
	// Redactor is told every value resolved from Secrets or Shared
	// before it is sent, so it is scrubbed from records, events and logs.
	Redactor Redactor
	// Shared gives the credential the document request carries, when
	// docAuth lets credentials go with it, for an entry with auth; nil
	// for none. A call's own credential comes from the harness instead
	// (connect.Credentials, resolved per call for its principal).
	Shared SharedCredentials
	// SharedOnly says every call uses the shared sign-in (auth without
	// perUser): until someone signs in, the connection needs a sign-in,
	// as a shared MCP server does, rather than being ready for calls
	// that are all refused.
	SharedOnly bool
	// CredentialsOnlyTo is the only origin the entry's credentials may
	// go to, whatever baseUrl says: a GitHub App's apiBaseUrl. Empty:
	// baseUrl, else the document's own origin (see checkCredentialTarget).
	CredentialsOnlyTo string
}

// Provider opens the connection behind one openapi entry.
type Provider struct {
	name string
	spec config.OpenAPI
	opts Options

	mu    sync.Mutex
	sum   string // the operations' hash at the last load
	epoch int64
}

// New returns the provider of the entry called name.
func New(name string, spec config.OpenAPI, opts *Options) *Provider {
	p := &Provider{name: name, spec: spec, epoch: 1}
	if opts != nil {
		p.opts = *opts
	}
	if p.opts.HTTPClient == nil {
		p.opts.HTTPClient = &http.Client{}
	}
	if p.opts.Logger == nil {
		p.opts.Logger = slog.New(slog.DiscardHandler)
	}
	if p.opts.ReadFile == nil {
		p.opts.ReadFile = p.readFile
	}
	return p
}

// Secrets lists the values of an entry to scrub from everything stored or
// shown: its header values and the userinfo and query values of its URLs.
func Secrets(spec config.OpenAPI) []string {
	set := map[string]bool{}
	for _, v := range spec.Headers {
		// A header holding ${secret:…} is resolved per call, and its
		// value registered then; the reference itself is no secret.
		if v != "" && !secretRefRE.MatchString(v) {
			set[v] = true
		}
	}
	for _, raw := range []string{spec.URL, spec.BaseURL} {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		if u.User != nil {
			set[u.User.Username()] = true
			if p, ok := u.User.Password(); ok {
				set[p] = true
			}
		}
		for _, vs := range u.Query() {
			for _, v := range vs {
				set[v] = true
			}
		}
	}
	delete(set, "")
	return slices.Sorted(maps.Keys(set))
}

func (p *Provider) maxBytes() int64 {
	if p.spec.MaxResponseBytes > 0 {
		return p.spec.MaxResponseBytes
	}
	return DefaultMaxResponseBytes
}

// Connect loads the document and lists its operations.
func (p *Provider) Connect(ctx context.Context) (connect.Conn, error) {
	timeout := DefaultTimeout
	if p.spec.TimeoutMs > 0 {
		timeout = time.Duration(p.spec.TimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	started := time.Now()
	if p.opts.SharedOnly && p.opts.Shared != nil {
		if _, _, err := p.opts.Shared.SharedHeaders(ctx, p.name); err != nil {
			return nil, fmt.Errorf("openapi %s: %w", p.name, err)
		}
	}
	data, docURL, err := p.fetchDocument(ctx)
	if err != nil {
		return nil, err
	}
	root, version, err := parseDocument(data)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", p.name, err)
	}
	sel, err := newSelector(p.spec.Include)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", p.name, err)
	}
	ops, unmatched, reduced, err := parseOperations(ctx, root, sel, newBudget(p.spec))
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", p.name, err)
	}
	base, from, err := p.baseURL(root, docURL)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", p.name, err)
	}
	// Per-call credentials are refused later on a base they may not go
	// to, should the harness hand some to an entry without auth.
	credErr := p.checkCredentialTarget(base, from)
	if credErr != nil && p.hasCredentials() {
		return nil, fmt.Errorf("openapi %s: %w", p.name, credErr)
	}
	mode, err := credhttp.ParseRedirects(p.spec.FollowRedirects)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", p.name, err)
	}
	c := &conn{
		provider: p, base: base, ops: map[string]operation{}, credErr: credErr,
		client: credhttp.Client(p.opts.HTTPClient, mode),
		info: map[string]any{
			"document": redactURL(p.spec.URL), "baseUrl": redactURL(base.String()), "openapi": version,
			"operations": len(ops), "loadMs": time.Since(started).Milliseconds(),
		},
	}
	if len(p.spec.Include) > 0 {
		c.info["include"] = p.spec.Include
	}
	if len(unmatched) > 0 {
		c.info["includeUnmatched"] = unmatched
		p.opts.Logger.Warn("openapi: include entries select no operation", "connection", p.name, "entries", unmatched)
	}
	if len(reduced) > 0 {
		c.info["schemasReduced"] = reducedInfo(reduced)
		p.opts.Logger.Warn("openapi: input schemas inlined fewer than 3 $ref levels deep to stay within maxSchemaNodes and maxSchemaBytes",
			"connection", p.name, "operations", len(reduced), "first", firstNames(reduced, 5))
	}
	if len(p.spec.Include) == 0 && len(ops) > WarnOperations {
		msg := fmt.Sprintf("%d operations without include: every one is a tool a model is offered; choose some with include", len(ops))
		c.info["warning"] = msg
		p.opts.Logger.Warn("openapi: "+msg, "connection", p.name)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", base)
	for _, op := range ops {
		c.manifest.Operations = append(c.manifest.Operations, op.Spec)
		c.ops[op.Name] = op
		fmt.Fprintf(h, "%s %s %s %s\n", op.Name, op.Method, op.Path, op.Spec.InputSchema)
	}
	c.identity = p.identity(hex.EncodeToString(h.Sum(nil))[:16])
	return c, nil
}

// reducedInfo is what status shows of the operations whose schemas were
// inlined less deep: how many, and the first few by name with the depth
// used (a few, so status stays small whatever the document).
func reducedInfo(reduced map[string]int) map[string]any {
	first := map[string]int{}
	for _, name := range firstNames(reduced, 10) {
		first[cut(name, 128)] = reduced[name]
	}
	return map[string]any{"count": len(reduced), "first": first}
}

func firstNames(m map[string]int, n int) []string {
	names := slices.Sorted(maps.Keys(m))
	return names[:min(n, len(names))]
}

// identity is the connection's identity for the operations hashed to
// sum. The instance names the document and what it declares (where calls
// go, and each operation's name, method, path and input schema), so every
// replica that loads the same document agrees on it, and a changed
// document is another thing to talk to: recorded results are judged
// against the identity they were made with, by the entry's determinism.
// The epoch moves on each time a reload finds the operations changed, as
// an MCP connection's does when its session is renewed.
func (p *Provider) identity(sum string) connect.Identity {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sum != sum {
		if p.sum != "" {
			p.epoch++
		}
		p.sum = sum
	}
	return connect.Identity{Surface: "openapi", Instance: redactURL(p.spec.URL) + "#" + sum, Epoch: p.epoch}
}

// parseDocument checks data is an OpenAPI 3 document and returns it as
// generic JSON (YAML turned into JSON's types) with its version. The
// document's structure is checked by decoding it into kin-openapi's types
// without resolving refs: the loader's resolution fails a whole document
// on one remote or broken ref, where this provider leaves such a schema
// open or such a parameter out.
func parseDocument(data []byte) (map[string]any, string, error) {
	var raw any
	js := data
	// JSON documents (GitHub's is 10 MB) take encoding/json's path, many
	// times faster than the YAML decoder's.
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' && json.Unmarshal(data, &raw) == nil {
	} else {
		raw = nil
		if err := yaml.Unmarshal(data, &raw); err != nil {
			return nil, "", fmt.Errorf("parse document: %w", err)
		}
		raw = jsonish(raw)
		js = nil
	}
	root, ok := raw.(map[string]any)
	if !ok {
		return nil, "", errors.New("document is not an object")
	}
	// kin-openapi decodes each nested schema from its own bytes again, so
	// its cost grows with size × depth: 4,000 levels took a minute.
	if !within(root, maxDocumentDepth) {
		return nil, "", fmt.Errorf("document nests deeper than %d levels", maxDocumentDepth)
	}
	version, _ := root["openapi"].(string)
	if !strings.HasPrefix(version, "3.") {
		return nil, "", fmt.Errorf("document's openapi version is %q: only OpenAPI 3.0 and 3.1 are supported", version)
	}
	if js == nil {
		var err error
		if js, err = json.Marshal(root); err != nil {
			return nil, "", fmt.Errorf("parse document: %w", err)
		}
	}
	var doc openapi3.T
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, "", fmt.Errorf("parse document: %w", err)
	}
	return root, version, nil
}

// within reports whether v nests at most depth objects and arrays deep.
func within(v any, depth int) bool {
	switch v := v.(type) {
	case map[string]any:
		if depth == 0 {
			return false
		}
		for _, x := range v {
			if !within(x, depth-1) {
				return false
			}
		}
	case []any:
		if depth == 0 {
			return false
		}
		for _, x := range v {
			if !within(x, depth-1) {
				return false
			}
		}
	}
	return true
}

// jsonish turns YAML's decoded values into JSON's: maps with non-string
// keys (responses: {200: …}) get string keys.
func jsonish(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = jsonish(x)
		}
		return v
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[fmt.Sprint(k)] = jsonish(x)
		}
		return out
	case []any:
		for i, x := range v {
			v[i] = jsonish(x)
		}
		return v
	default:
		return v
	}
}

// Where a base URL came from, for messages.
const (
	fromBaseURL   = "baseUrl"
	fromServers   = "servers[0].url"
	fromDocOrigin = "the document's origin"
)

// baseURL is baseUrl, else servers[0].url (its variables at their
// defaults, resolved against the document's URL when relative), else the
// document's origin; from says which.
func (p *Provider) baseURL(root map[string]any, docURL *url.URL) (*url.URL, string, error) {
	if p.spec.BaseURL != "" {
		u, err := url.Parse(p.spec.BaseURL)
		return u, fromBaseURL, err
	}
	if servers, ok := root["servers"].([]any); ok && len(servers) > 0 {
		if s, ok := servers[0].(map[string]any); ok {
			if raw, ok := s["url"].(string); ok && raw != "" {
				vars, _ := s["variables"].(map[string]any)
				for name, v := range vars {
					if m, ok := v.(map[string]any); ok {
						raw = strings.ReplaceAll(raw, "{"+name+"}", fmt.Sprint(m["default"]))
					}
				}
				u, err := url.Parse(raw)
				if err != nil {
					return nil, "", fmt.Errorf("servers[0].url: %w", err)
				}
				if docURL != nil && !u.IsAbs() {
					u = docURL.ResolveReference(u)
				}
				if u.IsAbs() && (u.Scheme == "http" || u.Scheme == "https") {
					return u, fromServers, nil
				}
			}
		}
	}
	if docURL != nil && (docURL.Scheme == "http" || docURL.Scheme == "https") {
		return &url.URL{Scheme: docURL.Scheme, Host: docURL.Host}, fromDocOrigin, nil
	}
	return nil, "", errors.New("no base URL: set baseUrl, or give the document an absolute servers[0].url")
}

// hasCredentials says whether calls carry anything secret: configured
// headers, or a sign-in's or a GitHub App's token.
func (p *Provider) hasCredentials() bool {
	return len(p.spec.Headers) > 0 || p.opts.Shared != nil || p.opts.CredentialsOnlyTo != ""
}

// checkCredentialTarget refuses a base URL the entry's credentials may
// not go to. Credentials go where the config says, never where a
// document says: to CredentialsOnlyTo's origin when it is set (a GitHub
// App's tokens go only to its GitHub), else to baseUrl, else only to
// the origin of the document's configured URL — a servers[0].url on
// another host, a document read from a file or redirected elsewhere
// need baseUrl to say so.
func (p *Provider) checkCredentialTarget(base *url.URL, from string) error {
	shown := redactURL(base.String())
	if to := p.opts.CredentialsOnlyTo; to != "" {
		if !credhttp.SameOrigin(base.String(), to) {
			return fmt.Errorf("calls would go to %s (%s), but the GitHub App's tokens go only to its apiBaseUrl %s: set baseUrl on that origin", shown, from, redactURL(to))
		}
		return nil
	}
	if from == fromBaseURL || credhttp.SameOrigin(base.String(), p.spec.URL) {
		return nil
	}
	where := "names " + shown + " as its " + from
	if from == fromDocOrigin {
		where = "was read from " + shown + ", another origin"
	}
	return fmt.Errorf("the document %s %s, and credentials go only where the config says: set baseUrl: %s to send them there", redactURL(p.spec.URL), where, shown)
}

// redactURL drops a URL's userinfo and query, which may hold credentials,
// before it is shown.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return raw
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only JSON's own types reach here (the document was JSON or
		// YAML); a failure is a bug, not a bad document.
		panic(fmt.Sprintf("openapi: schema does not marshal: %v", err))
	}
	return b
}

// readFile reads a document file, failing past maxResponseBytes without
// reading the rest: a file is bounded like a fetched document.
func (p *Provider) readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, p.maxBytes())
}

// readBounded reads at most limit bytes of r, failing when there is more.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes (maxResponseBytes)", limit)
	}
	return data, nil
}
