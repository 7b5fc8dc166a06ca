package gates

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// CodeConnectionNotAllowed: a document asks for more than its allowlist
// grants.
const CodeConnectionNotAllowed fault.Code = "CONNECTION_NOT_ALLOWED"

// Grant is what an allowlist lets documents use of one connection.
type Grant struct {
	// Ops are operation globs (path.Match syntax: "ui.*", "note_get").
	Ops []string `json:"ops,omitempty"`
	// Events are event globs a wait may listen for.
	Events []string `json:"events,omitempty"`
	// Setup holds, per setup field, the patterns a document's value must
	// match (pooled connections).
	Setup map[string][]string `json:"setup,omitempty"`
	// Secrets binds each secret a document may use to exactly one
	// operation field, "<op>.<field>", so a secret granted for a password
	// box cannot be typed into a chat message.
	Secrets map[string]string `json:"secrets,omitempty"`
}

// MCPGrant lets documents bring their own MCP server: the exact URL, or the
// exact command and arguments, the secrets its headers or environment may
// use, and the operations documents may call on it.
type MCPGrant struct {
	Name    string   `json:"name"`
	URL     string   `json:"url,omitempty"`
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	Secrets []string `json:"secrets,omitempty"`
	Ops     []string `json:"ops,omitempty"`
}

// Allowlist is a named set of grants: what documents sent by the keys bound
// to it may use. No allowlist, or an empty one, grants nothing.
type Allowlist struct {
	Name        string           `json:"name"`
	Connections map[string]Grant `json:"connections"`
	MCP         []MCPGrant       `json:"mcp,omitempty"`
	// Agents are the config file's agents (by name) that acp-agent nodes
	// may run. The command behind a name is the host's alone.
	Agents    []string  `json:"agents,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
	UpdatedBy string    `json:"updatedBy"`
}

// ParseAllowlist decodes and validates an allowlist body. Every problem is
// reported with its JSON Pointer, as for documents, so the API and the
// admin UI show the same messages.
func ParseAllowlist(name string, raw []byte) (*Allowlist, error) {
	var problems []fault.FieldError
	bad := func(p, format string, args ...any) {
		problems = append(problems, fault.FieldError{Path: p, Code: fault.CodeValidationFailed, Message: fmt.Sprintf(format, args...)})
	}
	if !registry.ValidName(name) {
		bad("name", "an allowlist name is a letter followed by letters, digits, '_' or '-' (at most 64)")
	}
	var body struct {
		Connections map[string]Grant `json:"connections"`
		MCP         []MCPGrant       `json:"mcp"`
		Agents      []string         `json:"agents"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		bad("", "not a valid allowlist: %v", err)
		return nil, &fault.ValidationError{Problems: problems}
	}
	for _, conn := range document.SortedKeys(body.Connections) {
		g, at := body.Connections[conn], "/connections/"+fault.Escape(conn)
		if !registry.ValidName(conn) {
			bad(at, "%q is not a valid connection name", conn)
		}
		checkGlobs(at+"/ops", g.Ops, bad)
		checkGlobs(at+"/events", g.Events, bad)
		for _, field := range document.SortedKeys(g.Setup) {
			checkGlobs(at+"/setup/"+fault.Escape(field), g.Setup[field], bad)
		}
		for _, secret := range document.SortedKeys(g.Secrets) {
			p := at + "/secrets/" + fault.Escape(secret)
			if !secrets.ValidSecretName(secret) {
				bad(p, "%q is not a valid secret name (letters, digits, '.', '_', '-')", secret)
			}
			if op, field, ok := cutField(g.Secrets[secret]); !ok || op == "" || field == "" {
				bad(p, "must name one operation field as \"<op>.<field>\", not %q", g.Secrets[secret])
			}
		}
	}
	for i, g := range body.MCP {
		at := fmt.Sprintf("/mcp/%d", i)
		if !registry.ValidName(g.Name) {
			bad(at+"/name", "%q is not a valid connection name", g.Name)
		}
		if (g.URL == "") == (g.Command == "") {
			bad(at, "needs exactly one of url and command")
		}
		for j, sec := range g.Secrets {
			if !secrets.ValidSecretName(sec) {
				bad(fmt.Sprintf("%s/secrets/%d", at, j), "%q is not a valid secret name", sec)
			}
		}
		checkGlobs(at+"/ops", g.Ops, bad)
	}
	for i, a := range body.Agents {
		if !registry.ValidName(a) {
			bad(fmt.Sprintf("/agents/%d", i), "%q is not a valid agent name", a)
		}
	}
	if len(problems) > 0 {
		return nil, &fault.ValidationError{Problems: problems}
	}
	if body.Connections == nil {
		body.Connections = map[string]Grant{}
	}
	return &Allowlist{Name: name, Connections: body.Connections, MCP: body.MCP, Agents: body.Agents}, nil
}

// MCPGrant returns the grant for an attached server, if the allowlist has
// one for exactly that URL or command line.
func (al *Allowlist) MCPGrant(spec document.AttachSpec) (MCPGrant, bool) {
	if al == nil {
		return MCPGrant{}, false
	}
	for _, g := range al.MCP {
		if g.Name == spec.Name && g.URL == spec.URL && g.Command == spec.Command && slices.Equal(g.Args, spec.Args) {
			return g, true
		}
	}
	return MCPGrant{}, false
}

func checkGlobs(at string, globs []string, bad func(string, string, ...any)) {
	for i, g := range globs {
		if _, err := path.Match(g, ""); err != nil || g == "" {
			bad(fmt.Sprintf("%s/%d", at, i), "%q is not a valid glob", g)
		}
	}
}

// cutField splits "<op>.<field>" at its last dot: operation names may hold
// dots ("ui.fill.text" is field text of ui.fill).
func cutField(binding string) (op, field string, ok bool) {
	i := strings.LastIndexByte(binding, '.')
	if i < 0 {
		return "", "", false
	}
	return binding[:i], binding[i+1:], true
}

// allows reports whether al grants op on conn.
func (al *Allowlist) allows(conn, op string) bool {
	if al == nil {
		return false
	}
	g, ok := al.Connections[conn]
	return ok && document.MatchOp(g.Ops, op)
}

// Check reports what doc asks for beyond al.
func (al *Allowlist) Check(doc *document.Document, base string) []fault.FieldError {
	var problems []fault.FieldError
	deny := func(p, format string, args ...any) {
		problems = append(problems, fault.FieldError{Path: p, Code: CodeConnectionNotAllowed, Message: fmt.Sprintf(format, args...)})
	}
	granted := func(conn string) bool {
		if al == nil {
			return false
		}
		_, ok := al.Connections[conn]
		return ok
	}
	for _, name := range doc.Connections {
		at := base + "/connections/" + fault.Escape(name)
		if h, ok := doc.Handles[name]; ok {
			al.checkHandle(h, at, deny)
			continue
		}
		if spec, ok := doc.Attached[name]; ok {
			g, ok := al.MCPGrant(spec)
			if !ok {
				deny(at+"/mcp", "the allowlist grants no server %q at that exact url or command", name)
				continue
			}
			for _, sec := range spec.Secrets() {
				if !slices.Contains(g.Secrets, sec) {
					deny(at+"/mcp", "the allowlist does not grant secret %q to server %q", sec, name)
				}
			}
			continue
		}
		if !granted(name) {
			deny(at, "the allowlist grants no access to connection %q", name)
		}
	}
	doc.Walk(func(n *document.Node) {
		if n.Agent != nil && (al == nil || !slices.Contains(al.Agents, n.Agent.Agent)) {
			problems = append(problems, fault.FieldError{Path: n.Path + "/agent", Code: CodeAgentNotAllowed,
				Message: fmt.Sprintf("the allowlist grants no agent %q (step %s)", n.Agent.Agent, n.ID)})
		}
		if h, ok := doc.Handles[n.Connection]; ok {
			c := *n // a call on a handle is judged by its pool's grant
			c.Connection = h.Pool
			n = &c
		}
		if n.Kind == document.KindRead {
			// A verify's profile read: its name is granted like an
			// operation's.
			if spec, ok := doc.Attached[n.Connection]; ok {
				if g, ok := al.MCPGrant(spec); ok && !document.MatchOp(g.Ops, n.Op) {
					deny(n.Path+"/read", "the allowlist does not grant read %q of server %q (step %s)", n.Op, n.Connection, n.ID)
				}
			} else if granted(n.Connection) && !al.allows(n.Connection, n.Op) {
				deny(n.Path+"/read", "the allowlist does not grant read %q of connection %q (step %s)", n.Op, n.Connection, n.ID)
			}
			return
		}
		if spec, ok := doc.Attached[n.Connection]; ok && n.Kind == document.KindCall {
			if g, ok := al.MCPGrant(spec); ok && !document.MatchOp(g.Ops, n.Op) {
				deny(n.Path+"/op", "the allowlist does not grant operation %q of server %q (step %s)", n.Op, n.Connection, n.ID)
			}
			for _, s := range n.Secrets {
				deny(s.Path, "secret %q: arguments to a server the document brings may not carry secrets (step %s)", s.Name, n.ID)
			}
			return
		}
		if n.Kind == document.KindWait && granted(n.Connection) && !document.MatchAny(al.Connections[n.Connection].Events, n.Event) {
			deny(n.Path+"/event", "the allowlist does not grant event %q of connection %q (step %s)", n.Event, n.Connection, n.ID)
		}
		if n.Kind != document.KindCall || !granted(n.Connection) {
			return
		}
		if !al.allows(n.Connection, n.Op) {
			deny(n.Path+"/op", "the allowlist does not grant operation %q of connection %q (step %s)", n.Op, n.Connection, n.ID)
		}
		for _, s := range n.Secrets {
			want := al.Connections[n.Connection].Secrets[s.Name]
			if want != n.Op+"."+s.Field {
				deny(s.Path, "secret %q is not granted for %s.%s (step %s)", s.Name, n.Op, s.Field, n.ID)
			}
		}
	})
	return problems
}

// CodeAgentNotAllowed: an acp-agent node names an agent its allowlist
// does not grant.
const CodeAgentNotAllowed fault.Code = "AGENT_NOT_ALLOWED"

// ErrAllowlistNotFound is returned for an allowlist that does not exist.
var ErrAllowlistNotFound = errors.New("allowlist not found")

// Allowlists keeps allowlists in Redis, with a short history of changes.
//
// A grant of a server that runs a command on this host (an mcp grant with
// a command) is trusted only from the config file: Seed keeps such grants
// in memory, never in Redis, Get adds them back, and Put refuses any
// command grant the config file did not make. Whoever can write an
// allowlist through the API or the UI therefore cannot make the host run
// a program, and a command grant found in Redis (written by an older
// version) is ignored.
type Allowlists struct {
	store *store.Store
	mu    sync.RWMutex
	host  map[string][]MCPGrant // allowlist name → the config file's command grants
	// changes counts the changes made through this value; every change is
	// also announced on ChangedChannel, for the other processes' copies.
	changes atomic.Uint64
}

// ChangedChannel is the channel every change of an allowlist is announced
// on (the message is its name), so that a process keeping copies drops
// them.
func (a *Allowlists) ChangedChannel() string { return a.store.Key("allowlists-changed") }

// Changes counts the changes made through a in this process: a copy taken
// at one count is stale at another.
func (a *Allowlists) Changes() uint64 { return a.changes.Load() }

// changed counts a change and announces it. The announcement is best
// effort: a process that misses it keeps its copy only as long as it keeps
// copies at all.
func (a *Allowlists) changed(ctx context.Context, name string) {
	a.changes.Add(1)
	_ = a.store.Client.Publish(ctx, a.ChangedChannel(), name).Err()
}

// NewAllowlists returns the allowlist store over st.
func NewAllowlists(st *store.Store) *Allowlists {
	return &Allowlists{store: st, host: map[string][]MCPGrant{}}
}

// CodeHostGrant: an allowlist written through the API or the UI grants a
// server that runs a command on the host.
const CodeHostGrant fault.Code = "HOST_GRANT_REFUSED"

func (a *Allowlists) hostGrants(name string) []MCPGrant {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.host[name]
}

// withoutCommands splits al's mcp grants into those that run a command
// and the rest.
func withoutCommands(grants []MCPGrant) (rest, commands []MCPGrant) {
	for _, g := range grants {
		if g.Command != "" {
			commands = append(commands, g)
		} else {
			rest = append(rest, g)
		}
	}
	return rest, commands
}

// refuseCommands reports each command grant of al that the config file
// did not make; those it did make are dropped, since Get adds them back.
func (a *Allowlists) refuseCommands(al *Allowlist) error {
	host := a.hostGrants(al.Name)
	var problems []fault.FieldError
	var rest []MCPGrant
	for i, g := range al.MCP {
		if g.Command == "" {
			rest = append(rest, g)
			continue
		}
		if !slices.ContainsFunc(host, func(h MCPGrant) bool { return sameGrant(h, g) }) {
			problems = append(problems, fault.FieldError{Path: fmt.Sprintf("/mcp/%d/command", i), Code: CodeHostGrant,
				Message: "a server that runs a command on this host can be granted only in the config file"})
		}
	}
	if len(problems) > 0 {
		return &fault.ValidationError{Problems: problems}
	}
	al.MCP = rest
	return nil
}

func sameGrant(a, b MCPGrant) bool {
	return a.Name == b.Name && a.URL == b.URL && a.Command == b.Command && slices.Equal(a.Args, b.Args) &&
		slices.Equal(a.Secrets, b.Secrets) && slices.Equal(a.Ops, b.Ops)
}

func (a *Allowlists) key(name string) string     { return a.store.Key("allowlist", name) }
func (a *Allowlists) history(name string) string { return a.store.Key("allowlist-history", name) }
func (a *Allowlists) indexKey() string           { return a.store.Key("allowlists") }

// historyLen bounds the change history kept per allowlist.
const historyLen = 50

// Change is one entry of an allowlist's history.
type Change struct {
	At     time.Time  `json:"at"`
	By     string     `json:"by"`
	Action string     `json:"action"` // created, updated, deleted, seeded
	After  *Allowlist `json:"after,omitempty"`
}

// Get returns the named allowlist, or ErrAllowlistNotFound.
func (a *Allowlists) Get(ctx context.Context, name string) (*Allowlist, error) {
	data, err := a.store.Client.Get(ctx, a.key(name)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("allowlist %s: %w", name, ErrAllowlistNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("allowlists: get %s: %w", name, err)
	}
	var al Allowlist
	if err := json.Unmarshal(data, &al); err != nil {
		return nil, fmt.Errorf("allowlists: decode %s: %w", name, err)
	}
	al.MCP, _ = withoutCommands(al.MCP)
	al.MCP = append(al.MCP, a.hostGrants(name)...)
	return &al, nil
}

// List returns every allowlist, by name.
func (a *Allowlists) List(ctx context.Context) ([]*Allowlist, error) {
	names, err := a.store.Client.SMembers(ctx, a.indexKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("allowlists: list: %w", err)
	}
	slices.Sort(names)
	out := make([]*Allowlist, 0, len(names))
	for _, n := range names {
		al, err := a.Get(ctx, n)
		if errors.Is(err, ErrAllowlistNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, al)
	}
	return out, nil
}

// Put creates or replaces an allowlist; created reports which. A command
// grant the config file did not make is refused (CodeHostGrant).
func (a *Allowlists) Put(ctx context.Context, al *Allowlist, by string) (created bool, err error) {
	if err := a.refuseCommands(al); err != nil {
		return false, err
	}
	created, err = a.write(ctx, al, by, false)
	al.MCP = append(al.MCP, a.hostGrants(al.Name)...)
	return created, err
}

// Seed writes al only when no allowlist of that name exists, so edits made
// through the API survive a restart with the same config file. Its
// command grants are kept in memory as the host's, whether or not it was
// written.
func (a *Allowlists) Seed(ctx context.Context, al *Allowlist) (bool, error) {
	var commands []MCPGrant
	al.MCP, commands = withoutCommands(al.MCP)
	a.mu.Lock()
	a.host[al.Name] = commands
	a.mu.Unlock()
	return a.write(ctx, al, "config", true)
}

func (a *Allowlists) write(ctx context.Context, al *Allowlist, by string, onlyNew bool) (bool, error) {
	al.UpdatedAt, al.UpdatedBy = time.Now().UTC(), by
	data, err := json.Marshal(al)
	if err != nil {
		return false, fmt.Errorf("allowlists: encode %s: %w", al.Name, err)
	}
	var created bool
	if onlyNew {
		created, err = a.store.Client.SetNX(ctx, a.key(al.Name), data, 0).Result()
	} else {
		err = a.store.Client.SetArgs(ctx, a.key(al.Name), data, redis.SetArgs{Get: true}).Err()
		created = errors.Is(err, redis.Nil)
		if created {
			err = nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("allowlists: put %s: %w", al.Name, err)
	}
	a.changed(ctx, al.Name)
	if onlyNew && !created {
		return false, nil
	}
	action := map[bool]string{true: "created", false: "updated"}[created]
	if onlyNew {
		action = "seeded"
	}
	a.record(ctx, al.Name, Change{At: al.UpdatedAt, By: by, Action: action, After: al})
	return created, a.store.Client.SAdd(ctx, a.indexKey(), al.Name).Err()
}

// Delete removes the named allowlist.
func (a *Allowlists) Delete(ctx context.Context, name, by string) error {
	n, err := a.store.Client.Del(ctx, a.key(name)).Result()
	if err != nil {
		return fmt.Errorf("allowlists: delete %s: %w", name, err)
	}
	if n == 0 {
		return fmt.Errorf("allowlist %s: %w", name, ErrAllowlistNotFound)
	}
	a.changed(ctx, name)
	a.store.Client.SRem(ctx, a.indexKey(), name)
	a.record(ctx, name, Change{At: time.Now().UTC(), By: by, Action: "deleted"})
	return nil
}

func (a *Allowlists) record(ctx context.Context, name string, c Change) {
	data, _ := json.Marshal(c)
	a.store.Client.LPush(ctx, a.history(name), data)
	a.store.Client.LTrim(ctx, a.history(name), 0, historyLen-1)
}

// History returns the newest changes of an allowlist first.
func (a *Allowlists) History(ctx context.Context, name string) ([]Change, error) {
	items, err := a.store.Client.LRange(ctx, a.history(name), 0, historyLen-1).Result()
	if err != nil {
		return nil, fmt.Errorf("allowlists: history %s: %w", name, err)
	}
	out := make([]Change, 0, len(items))
	for _, it := range items {
		var c Change
		if json.Unmarshal([]byte(it), &c) == nil {
			out = append(out, c)
		}
	}
	return out, nil
}

// Describe lists what a planner may use under al: each granted connection's
// granted operations with their argument schemas.
func Describe(reg *registry.Registry, al *Allowlist) map[string][]connect.Operation {
	out := map[string][]connect.Operation{}
	for _, conn := range document.SortedKeys(al.Connections) {
		c, err := reg.Get(conn)
		if err != nil {
			continue
		}
		ops := []connect.Operation{}
		for _, op := range c.Manifest().Operations {
			if al.allows(conn, op.Name) {
				ops = append(ops, op)
			}
		}
		out[conn] = ops
	}
	return out
}

// checkHandle reports what a handle asks of its pool beyond al: the pool
// must be granted, and every setup field must have patterns in the grant
// that its value matches (a string as is, anything else as JSON).
func (al *Allowlist) checkHandle(h document.Handle, at string, deny func(p, format string, args ...any)) {
	var g Grant
	ok := false
	if al != nil {
		g, ok = al.Connections[h.Pool]
	}
	if !ok {
		deny(at, "the allowlist grants no access to pool %q", h.Pool)
		return
	}
	for _, field := range document.SortedKeys(h.Setup) {
		p := at + "/setup/" + fault.Escape(field)
		patterns, granted := g.Setup[field]
		if !granted {
			deny(p, "the allowlist grants no setup field %q for pool %q", field, h.Pool)
			continue
		}
		if !document.MatchAny(patterns, document.SetupText(h.Setup[field])) {
			deny(p, "setup field %q of pool %q does not match the patterns the allowlist grants", field, h.Pool)
		}
	}
}
