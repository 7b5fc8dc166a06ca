// Package registry holds a deployment's named connections: each one's
// provider, live Conn, state and status, policy (deny, approve, allow,
// approvers, determinism), the profiles it speaks and the binding that
// maps it onto one, and the events and leases it offers. The engine calls
// through it; the API, the admin UI, the triggers and the server's start
// read and change it.
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// ValidName reports whether s may name a connection: a letter, then
// letters, digits, '_' or '-', at most 64 characters. The rule is the
// config file's, so a name the config accepts is one the registry accepts.
func ValidName(s string) bool { return config.ValidName(s) }

// Registry holds the named connections of one deployment.
type Registry struct {
	mu     sync.RWMutex
	conns  map[string]*Connection
	logger *slog.Logger
	// catalog: the profiles references resolve against (profiles.go).
	catalog *profiles.Catalog
}

// NewRegistry returns an empty registry. A nil logger discards.
func NewRegistry(logger *slog.Logger) *Registry {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Registry{conns: map[string]*Connection{}, logger: logger}
}

// Add registers a connection under name. It does not connect; Start does.
func (r *Registry) Add(name string, p connect.Provider) error {
	if !ValidName(name) {
		return fault.Errorf(fault.CodeConnectionInvalid, "connection name %q must be a letter followed by letters, digits, '_' or '-' (at most 64)", name)
	}
	if p == nil {
		return fault.Errorf(fault.CodeConnectionInvalid, "connection %q has no provider", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.conns[name]; ok {
		return fault.Errorf(fault.CodeConnectionNameTaken, "connection %q is already registered", name)
	}
	r.conns[name] = &Connection{name: name, provider: p, catalog: r.catalog, state: connect.StateConnecting, since: time.Now(), logger: r.logger, stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	return nil
}

// Get returns the named connection.
func (r *Registry) Get(name string) (*Connection, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.conns[name]
	if !ok {
		return nil, fault.Errorf(fault.CodeConnectionUnknown, "no connection named %q", name)
	}
	return c, nil
}

// List returns every connection, sorted by name.
func (r *Registry) List() []*Connection {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*Connection, 0, len(r.conns))
	for _, c := range r.conns {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *Connection) int {
		if a.name < b.name {
			return -1
		}
		if a.name > b.name {
			return 1
		}
		return 0
	})
	return out
}

// Start connects every connection concurrently. A connection that fails is
// left unavailable with its error while the others carry on; Start returns
// the first failure (by name order) after all attempts have finished.
func (r *Registry) Start(ctx context.Context) error {
	conns := r.List()
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			errs[i] = c.connect(ctx)
			if errs[i] != nil {
				r.logger.Error("connection failed to start", "connection", c.name, "err", errs[i])
				go c.reconnect()
				return
			}
			r.logger.Info("connection ready", "connection", c.name, "operations", len(c.Manifest().Operations))
		})
	}
	wg.Wait()
	return firstError(errs)
}

// Close closes every connection, even when some fail, and returns the first
// failure.
func (r *Registry) Close() error {
	conns := r.List()
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { errs[i] = c.Close() })
	}
	wg.Wait()
	return firstError(errs)
}

func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Connection is one named connection: its provider, the live Conn once
// connected, and its status.
type Connection struct {
	name     string
	provider connect.Provider

	mu       sync.RWMutex
	policy   Policy
	access   Access
	kind     string // for reports, see SetKind
	url      string
	conn     connect.Conn
	manifest connect.Manifest
	// catalog, binding and spoken: the profiles it speaks (profiles.go).
	catalog *profiles.Catalog
	binding *profiles.Binding
	spoken  []SpokenProfile
	state   connect.State
	lastErr string
	since   time.Time

	// Reconnecting: a Conn that reports its loss (see lossReporter) is
	// marked unavailable and replaced in the background until close.
	logger    *slog.Logger
	stop      chan struct{}
	kick      chan struct{}
	closeOnce sync.Once
}

// Access says whom a connection acts for, from the host's config.
type Access struct {
	// SignIn is how the connection is signed in to: "" (its configured
	// credentials), SignInShared (one OAuth sign-in by an operator) or
	// SignInPerUser (each principal signs in for their own calls).
	SignIn string
	// RequiresPrincipal hides the connection from executions that run for
	// no principal (trusted host runs such as cron triggers): it acts as a
	// user, and there is none.
	RequiresPrincipal bool
	// GitHubApp is the GitHub App whose installation tokens the
	// connection's calls carry, as configured; nil for none.
	GitHubApp *GitHubAppAuth
}

// GitHubAppAuth says how a connection authenticates with a GitHub App,
// for status: which App, on which GitHub, and the scope of a call as
// configured. It never holds the private key or a token.
type GitHubAppAuth struct {
	AppID      string `json:"appId"`
	APIBaseURL string `json:"apiBaseUrl"`
	// Owner, Repo and Permissions are an MCP or OpenAPI connection's scope
	// of a call: a literal, or the expression over principal as written
	// (OwnerExpr, RepoExpr, PermissionsExpr). All are empty for a provider
	// connection, whose code names the scope of each token it asks for.
	Owner           string            `json:"owner,omitempty"`
	OwnerExpr       string            `json:"ownerExpr,omitempty"`
	Repo            string            `json:"repo,omitempty"`
	RepoExpr        string            `json:"repoExpr,omitempty"`
	Permissions     map[string]string `json:"permissions,omitempty"`
	PermissionsExpr string            `json:"permissionsExpr,omitempty"`
	// Discovery is the scope of requests made for no one (an MCP or
	// OpenAPI connection's tools/list or document request).
	Discovery *GitHubAppScope `json:"discovery,omitempty"`
}

// GitHubAppScope is a literal scope: one repository, the permissions.
type GitHubAppScope struct {
	Owner       string            `json:"owner"`
	Repo        string            `json:"repo"`
	Permissions map[string]string `json:"permissions"`
}

// ActsAsUser reports whether the connection must be hidden from
// executions without a principal: it requires one, or each user signs in
// to it with their own account.
func (a Access) ActsAsUser() bool { return a.RequiresPrincipal || a.SignIn == SignInPerUser }

// Sign-in kinds of Access.SignIn.
const (
	SignInShared  = "shared"
	SignInPerUser = "per-user"
)

// SetAccess sets whom the named connection acts for (from config).
func (r *Registry) SetAccess(name string, a Access) error {
	c, err := r.Get(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.access = a
	return nil
}

// Access is whom the connection acts for.
func (c *Connection) Access() Access {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.access
}

// Kick makes a connection that is waiting to reconnect try again now (a
// sign-in just completed). It does nothing to a ready connection.
func (r *Registry) Kick(name string) error {
	c, err := r.Get(name)
	if err != nil {
		return err
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return nil
}

// lossReporter is implemented by Conns that notice on their own when the
// thing behind them goes away (a child process exits, a stream breaks):
// Done is closed then and Err says why.
type lossReporter interface {
	Done() <-chan struct{}
	Err() error
}

// Reconnect backoff: doubled after each failed attempt, capped.
const (
	reconnectMin = 250 * time.Millisecond
	reconnectMax = 30 * time.Second
)

// SetPolicy sets the call policy of the named connection (from config).
func (r *Registry) SetPolicy(name string, p Policy) error {
	c, err := r.Get(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.policy = p
	return nil
}

// Policy is the connection's call policy.
func (c *Connection) Policy() Policy {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.policy
}

// Name is the connection's registered name.
func (c *Connection) Name() string { return c.name }

// Manifest is what the connection declared when it connected; empty until
// then.
func (c *Connection) Manifest() connect.Manifest {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.manifest
}

// SetKind records the named connection's kind (mcp, openapi, drive,
// source, cron) and where it reaches (a URL without credentials, or ""), shown in
// its status so that every connection reports {name, kind, url, tools}.
func (r *Registry) SetKind(name, kind, url string) error {
	c, err := r.Get(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kind, c.url = kind, url
	return nil
}

// Status reports the connection's state for operators.
func (c *Connection) Status() Status {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s := Status{Name: c.name, Kind: c.kind, URL: c.url, State: c.state, Operations: len(c.manifest.Operations), LastError: c.lastErr, Since: c.since,
		SignIn: c.access.SignIn, GitHubApp: c.access.GitHubApp, Pool: c.poolStatus(), Tools: []string{}, Profiles: c.profilesLocked()}
	if s.SignIn != "" {
		s.SignInURL = "/oauth/" + c.name + "/start"
	}
	if c.conn != nil {
		s.Identity = c.conn.Identity()
		s.Info = c.conn.Info()
		// Only a live connection offers tools: one that failed reports
		// none, not those it had before.
		names := make([]string, len(c.manifest.Operations))
		for i, op := range c.manifest.Operations {
			names[i] = op.Name
		}
		ids := connect.ToolIDs(c.name, names)
		for _, n := range names {
			s.Tools = append(s.Tools, ids[n])
		}
	}
	return s
}

// State is the connection's state: Status's State without the rest, which
// the hot path (every call checks it) does not need.
func (c *Connection) State() connect.State {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.state
}

// Identity is the identity of the live Conn, zero when not connected.
func (c *Connection) Identity() connect.Identity {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.conn == nil {
		return connect.Identity{}
	}
	return c.conn.Identity()
}

// Call runs one operation. It fails fast with ErrUnavailable when the
// connection is not ready and with ErrUnknownOperation when the manifest does
// not declare op.
func (c *Connection) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	c.mu.RLock()
	conn, state := c.conn, c.state
	_, declared := c.manifest.Operation(req.Op)
	c.mu.RUnlock()
	if state != connect.StateReady || conn == nil {
		return nil, fmt.Errorf("connection %s is %s: %w", c.name, state, connect.ErrUnavailable)
	}
	if !declared {
		return nil, fmt.Errorf("connection %s: %q: %w", c.name, req.Op, connect.ErrUnknownOperation)
	}
	return conn.Call(ctx, req)
}

func (c *Connection) connect(ctx context.Context) error {
	c.setState(connect.StateConnecting, "")
	return c.attempt(ctx)
}

// Reset replaces the live Conn with a new one: a costly connection's world
// is rebuilt before the steps recorded against the old one run again.
func (c *Connection) Reset(ctx context.Context) error {
	c.mu.Lock()
	old := c.conn
	c.conn, c.state, c.since = nil, connect.StateConnecting, time.Now()
	c.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return c.attempt(ctx)
}

// attempt connects once; on failure the connection is unavailable.
func (c *Connection) attempt(ctx context.Context) error {
	conn, err := c.provider.Connect(ctx)
	if err != nil {
		state := connect.StateUnavailable
		if errors.Is(err, connect.ErrNeedsSignIn) {
			state = connect.StateNeedsSignIn
		}
		c.setState(state, err.Error())
		return fmt.Errorf("connection %s: connect: %w", c.name, err)
	}
	spokenConn, spoken, err := c.Speak(conn)
	if err != nil {
		// A server contradicting a profile it speaks would fail typed
		// steps one by one; it is unavailable instead, saying why.
		_ = conn.Close()
		c.setState(connect.StateUnavailable, err.Error())
		return fmt.Errorf("connection %s: %w", c.name, err)
	}
	conn = spokenConn
	c.mu.Lock()
	if c.state == connect.StateClosed {
		c.mu.Unlock()
		_ = conn.Close()
		return fmt.Errorf("connection %s: %w", c.name, connect.ErrUnavailable)
	}
	c.conn, c.manifest, c.spoken = conn, conn.Manifest(), spoken
	c.state, c.lastErr, c.since = connect.StateReady, "", time.Now()
	c.mu.Unlock()
	if lr, ok := conn.(lossReporter); ok && c.stop != nil {
		go c.watch(conn, lr)
	}
	return nil
}

// watch waits for conn to report its loss, marks the connection
// unavailable (its calls fail fast) and reconnects it.
func (c *Connection) watch(conn connect.Conn, lr lossReporter) {
	select {
	case <-lr.Done():
	case <-c.stop:
		return
	}
	msg := "connection lost"
	if err := lr.Err(); err != nil {
		msg = err.Error()
	}
	if !c.takeDown(conn, connect.StateUnavailable, msg) {
		return
	}
	if c.logger != nil {
		c.logger.Error("connection lost; reconnecting", "connection", c.name, "err", msg)
	}
	c.reconnect()
}

// takeDown takes the live Conn out of service and closes it, showing state
// and reason; with only set, just when that is still the live Conn. It
// reports whether it did (false: nothing live, already replaced or closed).
func (c *Connection) takeDown(only connect.Conn, state connect.State, reason string) bool {
	c.mu.Lock()
	conn := c.conn
	if conn == nil || c.state == connect.StateClosed || (only != nil && conn != only) {
		c.mu.Unlock()
		return false
	}
	c.conn, c.state, c.lastErr, c.since = nil, state, reason, time.Now()
	c.mu.Unlock()
	_ = conn.Close()
	return true
}

// NeedSignIn marks a ready connection whose shared sign-in stopped
// working (its refresh was refused): calls fail fast, status shows
// needs_sign_in with the sign-in link, and it reconnects once someone signs
// in again (Kick) or the backoff finds the server willing.
func (c *Connection) NeedSignIn(reason string) {
	if !c.takeDown(nil, connect.StateNeedsSignIn, reason) {
		return
	}
	if c.logger != nil {
		c.logger.Warn("connection needs a sign-in", "connection", c.name, "err", reason)
	}
	go c.reconnect()
}

// reconnect tries to connect again with capped exponential backoff until it
// succeeds or the connection is closed.
func (c *Connection) reconnect() {
	if c.stop == nil {
		return
	}
	delay := reconnectMin
	for {
		t := time.NewTimer(delay)
		select {
		case <-c.stop:
			t.Stop()
			return
		case <-t.C:
		case <-c.kick:
			t.Stop()
			delay = reconnectMin
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-c.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := c.attempt(ctx)
		cancel()
		if err == nil {
			if c.logger != nil {
				c.logger.Info("connection reconnected", "connection", c.name)
			}
			return
		}
		if c.stateIs(connect.StateClosed) {
			return
		}
		delay = min(delay*2, reconnectMax)
	}
}

func (c *Connection) stateIs(s connect.State) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.state == s
}

// Close stops the connection's reconnecting and closes its live Conn; the
// connection is closed from then on.
func (c *Connection) Close() error {
	if c.stop != nil {
		c.closeOnce.Do(func() { close(c.stop) })
	}
	c.mu.Lock()
	conn := c.conn
	c.conn, c.state, c.since = nil, connect.StateClosed, time.Now()
	c.mu.Unlock()
	if conn == nil {
		return nil
	}
	if err := conn.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("connection %s: close: %w", c.name, err)
	}
	return nil
}

func (c *Connection) setState(s connect.State, lastErr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state, c.since = s, time.Now()
	if lastErr != "" {
		c.lastErr = lastErr
	}
}

// Status is a connection's state as shown to operators.
type Status struct {
	Name string `json:"name"`
	// Kind and URL are what the host set with Registry.SetKind: mcp,
	// openapi, drive, source or cron, and the server's, document's or
	// API's URL without credentials.
	Kind string `json:"kind,omitempty"`
	URL  string `json:"url,omitempty"`
	// Tools are the model tool ids of its operations (see ToolIDs), in
	// manifest order; empty unless it is connected.
	Tools      []string         `json:"tools"`
	State      connect.State    `json:"state"`
	Identity   connect.Identity `json:"identity"`
	Operations int              `json:"operationCount"`
	Info       map[string]any   `json:"info,omitempty"`
	LastError  string           `json:"lastError,omitempty"`
	Since      time.Time        `json:"since"`
	// SignIn is "shared" or "per-user" for a connection signed in to with
	// OAuth (see Access); the sign-in link is /oauth/{name}/start.
	SignIn string `json:"signIn,omitempty"`
	// SignInURL is where a browser signs in to it, set with SignIn.
	SignInURL string `json:"signInUrl,omitempty"`
	// GitHubApp is set for a connection whose calls carry GitHub App
	// installation tokens (see Access).
	GitHubApp *GitHubAppAuth `json:"githubApp,omitempty"`
	// Pool is the usage of a pool connection; nil for others.
	Pool *connect.PoolStatus `json:"pool,omitempty"`
	// Profiles are the profiles it speaks, declared by its server or
	// given by a binding (see package profiles).
	Profiles []SpokenProfile `json:"profiles,omitempty"`
}

// NotReadyCode is the code of a refusal because a connection is in state s.
func NotReadyCode(s connect.State) fault.Code {
	switch s {
	case connect.StateConnecting:
		return fault.CodeConnectionStarting
	case connect.StateNeedsSignIn:
		return fault.CodeConnectionNeedsSignIn
	case connect.StateClosed:
		return fault.CodeConnectionClosed
	}
	return fault.CodeConnectionUnavailable
}

// Policy is a connection's call policy from the host's config.
type Policy struct {
	// Deny globs refuse matching operations at gate 4.
	Deny []string
	// Approve globs send matching operations to the approver (gate 5).
	Approve []string
	// Allow globs let matching operations a profile marks guarded run
	// without approval; nothing else needs allowing.
	Allow []string
	// Approvers, when set, are the only ones who may decide this
	// connection's approvals: principal names or "role:<role>".
	Approvers []string
	// Answerers, when set, are the only ones who may answer the questions
	// this connection's server asks (as Approvers: names or
	// "role:<role>"); a name here may answer its own execution's.
	Answerers []string
	// DeclineQuestions are question modes ("form", "url") declined
	// without asking anyone.
	DeclineQuestions []string
	// Determinism says what a resumed run does with results recorded
	// against a connection whose identity has since been replaced:
	// replayable keeps them; costly runs live again from the first
	// affected entry; unsafe (the default) refuses to resume unless the
	// resume names the connection in rerun.
	Determinism string
}

// Determinism values.
const (
	Replayable = "replayable"
	Costly     = "costly"
	Unsafe     = "unsafe"
)

// NewAttached is the connection to a server a document brought, ready as
// it was attached; it belongs to its run, not to a registry.
func NewAttached(name string, conn connect.Conn) *Connection {
	return &Connection{name: name, conn: conn, manifest: conn.Manifest(), state: connect.StateReady, since: time.Now()}
}

// LeasedFrom is the connection a run holds on lease leaseID of the pool c:
// conn is the lease's server as the pool speaks it (see Speak), under the
// pool's policy and binding. It carries the lease id, which sealed refs are
// bound to.
func (c *Connection) LeasedFrom(name string, conn connect.Conn, leaseID string, spoken []SpokenProfile) *Connection {
	return &Connection{name: name, conn: &LeasedConn{Conn: conn, lease: leaseID}, manifest: conn.Manifest(),
		state: connect.StateReady, since: time.Now(), policy: c.Policy(), binding: c.Binding(), spoken: spoken}
}

// Live is the connection's Conn now: nil while it has none.
func (c *Connection) Live() connect.Conn {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.conn
}
