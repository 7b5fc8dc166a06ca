package config

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/expr-lang/expr/types"
	"github.com/robfig/cron/v3"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// Source is an event stream that host code pushes to
// (POST /v1/sources/{name}/events) or a sender posts signed webhooks to
// (/hooks/{name}).
type Source struct {
	// Events maps each event type (a letter, then letters, digits, '_',
	// '.', ':', '/' or '-') to the JSON Schema its payloads must match,
	// draft 2020-12 unless the schema's $schema names another; at least one.
	Events map[string]any `yaml:"events"`
}

// Webhooks lets senders post Standard Webhooks to /hooks/{connection}.
type Webhooks struct {
	// Secrets verify signatures: "whsec_" then the base64 of a 24–64 byte
	// key. Several are allowed so a secret can be rotated without a gap.
	Secrets []string `yaml:"secrets"`
	// DedupeFor is how long a webhook-id (and event id) is remembered so
	// a retried delivery is dropped. Default 168h (senders retry for days).
	DedupeFor time.Duration `yaml:"dedupeFor"`
	// MaxBodyBytes bounds one delivery's body. Default 1 MiB (and never
	// more than PATCHBAY_MAX_BODY_BYTES, which bounds every request).
	MaxBodyBytes int64 `yaml:"maxBodyBytes"`
}

// Cron is a source with one event, tick, once per scheduled time.
type Cron struct {
	// Schedule is a five-field cron expression (minute hour dom month
	// dow) or a descriptor such as @daily.
	Schedule string `yaml:"schedule"`
	// Timezone is an IANA zone name; default UTC.
	Timezone string `yaml:"timezone"`
	// CatchUp says what happens to slots missed while no replica ran:
	// all (default, at most MaxCatchUp of the latest), latest, or none.
	CatchUp string `yaml:"catchUp"`
	// MaxCatchUp caps catch-up all; default 100.
	MaxCatchUp int `yaml:"maxCatchUp"`
}

// Trigger starts a turn for each matching event of a connection.
type Trigger struct {
	// ID names the trigger: unique, a letter followed by letters, digits,
	// '_' or '-' (at most 64). It keys each event's turn
	// (<connection>:<id>:<event id>), so a redelivered event starts no
	// second one.
	ID string `yaml:"id"`
	// Connection names the connection whose events start turns: a
	// source, a cron, or one that takes webhooks or is an mcp server.
	Connection string `yaml:"connection"`
	// Event is the event type that starts a turn: one of a source's
	// events, tick for a cron, or a type the webhook sender or MCP server
	// sends.
	Event string `yaml:"event"`
	// Filter is an expr-lang expression over event that must be true for
	// the event to start a turn; empty matches every event of the type.
	Filter string `yaml:"filter"`
	// Input is the turn's input: a JSON value in which {"$expr": "..."}
	// objects are expressions over event. The event itself is added as
	// connection_event.
	Input any `yaml:"input"`
	// Thread is an expression over event naming the turn's thread;
	// default the trigger's id.
	Thread string `yaml:"thread"`
	// Arguments are the subscription arguments sent to an MCP server
	// whose event the trigger names (its filter on the server's side,
	// such as mentionsAgent: true); only on mcp connections.
	Arguments map[string]any `yaml:"arguments"`
	// Workflow is the document the turn runs: a path (relative to the
	// config file) or the document inline.
	Workflow any `yaml:"workflow"`
	// Document is Workflow as JSON, read by Load.
	Document json.RawMessage `yaml:"-"`
}

// Inbox tunes delivery from the durable inbox.
type Inbox struct {
	// ReclaimAfter is how long an event may sit with a replica that has
	// stopped renewing it before another replica takes it. Default 30s.
	ReclaimAfter time.Duration `yaml:"reclaimAfter"`
	// MaxDeliveries is how many deliveries an event gets before it goes
	// to the dead-letter list. Default 5.
	MaxDeliveries int `yaml:"maxDeliveries"`
	// LogSize is how many recent deliveries (accepted, duplicate,
	// rejected) are kept per connection for the admin UI. Default 100.
	LogSize int `yaml:"logSize"`
	// PollFloor is the shortest wait between two events/poll requests of
	// one MCP event subscription, whatever nextPollMs the server suggests.
	// Default 1s.
	PollFloor time.Duration `yaml:"pollFloor"`
	// PollLease is how long a replica's hold on an MCP event subscription
	// lasts without renewal; another replica takes the subscription over
	// from its persisted cursor once it lapses. Default 15s.
	PollLease time.Duration `yaml:"pollLease"`
	// PollMaxEvents caps the events one events/poll answer may carry
	// (maxEvents), which bounds one ingest script. Default 100.
	PollMaxEvents int `yaml:"pollMaxEvents"`
	// PollTimeout is how long a server may hold an events/poll open
	// waiting for an event (timeoutMs, a long poll), so an event arrives
	// without waiting out nextPollMs. Default 20s.
	PollTimeout time.Duration `yaml:"pollTimeout"`
	// PollMaxAge bounds replay from a persisted cursor (maxAgeMs): after a
	// long stop, events older than this start no turns (the server says
	// truncated). Default 24h.
	PollMaxAge time.Duration `yaml:"pollMaxAge"`
	// HeartbeatTimeout is how long a push stream (events/stream) may carry
	// neither an event nor a heartbeat before it counts as broken and is
	// reopened from the persisted cursor. Default 60s: twice the 30 s the
	// MCP Events design asks servers to send heartbeats within.
	HeartbeatTimeout time.Duration `yaml:"heartbeatTimeout"`
}

// Limits and defaults of triggers and their sources.
const (
	DefaultDedupeFor     = 168 * time.Hour
	MinDedupeFor         = time.Hour
	MinWebhookKeyBytes   = 24
	MaxWebhookKeyBytes   = 64
	MaxWebhookSecrets    = 10
	DefaultMaxCatchUp    = 100
	MaxMaxCatchUp        = 10_000
	DefaultReclaimAfter  = 30 * time.Second
	MinReclaimAfter      = time.Second
	DefaultMaxDeliveries = 5
	DefaultLogSize       = 100
	DefaultPollFloor     = time.Second
	MinPollFloor         = 10 * time.Millisecond
	DefaultPollLease     = 15 * time.Second
	MinPollLease         = time.Second
	DefaultPollMaxEvents = 100
	MaxPollMaxEvents     = 1000
	DefaultPollTimeout   = 20 * time.Second
	MaxPollTimeout       = 5 * time.Minute
	DefaultPollMaxAge    = 24 * time.Hour
	MinPollMaxAge        = time.Second
	DefaultHeartbeatWait = 60 * time.Second
	MinHeartbeatWait     = 100 * time.Millisecond
	CronEventTick        = "tick"
)

// CatchUp policies of a cron source.
var CatchUpPolicies = []string{"all", "latest", "none"}

var eventTypeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.:/-]{0,127}$`)

// ValidEventType reports whether s may name an event type.
func ValidEventType(s string) bool { return eventTypeRE.MatchString(s) }

// CronParser parses cron schedules as patchbay reads them: five fields or
// a descriptor (@daily), no seconds, no TZ= prefix (timezone is a field).
var CronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseSchedule parses a cron schedule into the field sets patchbay
// evaluates in civil time. @every is refused: it has no slots.
func ParseSchedule(s string) (*cron.SpecSchedule, error) {
	if strings.HasPrefix(strings.TrimSpace(s), "TZ=") || strings.HasPrefix(strings.TrimSpace(s), "CRON_TZ=") {
		return nil, fmt.Errorf("set the zone with timezone, not a TZ= prefix")
	}
	sched, err := CronParser.Parse(s)
	if err != nil {
		return nil, err
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("@every has no fixed slots; use a cron expression")
	}
	return spec, nil
}

// WebhookKey decodes a "whsec_" secret and checks its length. Its errors
// never quote the secret.
func WebhookKey(secret string) ([]byte, error) {
	raw, ok := strings.CutPrefix(secret, "whsec_")
	if !ok {
		return nil, fmt.Errorf(`must start with "whsec_"`)
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return nil, fmt.Errorf(`must be "whsec_" followed by standard base64`)
	}
	if len(key) < MinWebhookKeyBytes || len(key) > MaxWebhookKeyBytes {
		return nil, fmt.Errorf("key must be %d to %d bytes, not %d", MinWebhookKeyBytes, MaxWebhookKeyBytes, len(key))
	}
	return key, nil
}

// CompileEventSchema compiles one event's payload schema (a value decoded
// from YAML) with JSON Schema draft 2020-12 as the default dialect.
func CompileEventSchema(schema any) (*jsonschema.Schema, error) {
	data, err := json.Marshal(schema)
	if err != nil {
		return nil, fmt.Errorf("is not representable as JSON: %v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("event.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("event.json")
}

// TriggerEnv is the type of what trigger expressions see: the event as a
// map with connection, type, id, payload and receivedAt.
func TriggerEnv() types.Map { return types.Map{"event": types.TypeOf(map[string]any{})} }

// CompileExpr compiles a trigger expression. Trigger expressions run under
// the same limits as a document's (package sandbox), through this one
// helper, both when the config is validated and when triggers are built.
func CompileExpr(src string) (*sandbox.Program, error) {
	return sandbox.Compile(src, TriggerEnv())
}

func (s *Source) validate(ps *problems, path string) {
	if len(s.Events) == 0 {
		ps.add(path+".events", "must map at least one event type to its payload's JSON Schema")
	}
	for _, typ := range slices.Sorted(maps.Keys(s.Events)) {
		p := path + ".events." + typ
		if !ValidEventType(typ) {
			ps.add(p, "event type must be a letter followed by letters, digits, '_', '.', ':', '/' or '-' (at most 128)")
			continue
		}
		if _, err := CompileEventSchema(s.Events[typ]); err != nil {
			ps.add(p, "is not a valid JSON Schema: %v", err)
		}
	}
}

func (w *Webhooks) validate(ps *problems, path string) {
	switch {
	case len(w.Secrets) == 0:
		ps.add(path+".secrets", "must list at least one whsec_ secret")
	case len(w.Secrets) > MaxWebhookSecrets:
		ps.add(path+".secrets", "must list at most %d secrets", MaxWebhookSecrets)
	}
	for i, s := range w.Secrets {
		if _, err := WebhookKey(s); err != nil {
			ps.add(fmt.Sprintf("%s.secrets[%d]", path, i), "%v", err)
		}
	}
	if w.DedupeFor != 0 && w.DedupeFor < MinDedupeFor {
		ps.add(path+".dedupeFor", "must be at least %s (senders retry for days), not %s", MinDedupeFor, w.DedupeFor)
	}
	if w.MaxBodyBytes != 0 && (w.MaxBodyBytes < MinMaxBodyBytes || w.MaxBodyBytes > MaxMaxBodyBytes) {
		ps.add(path+".maxBodyBytes", "must be between %d (1 KiB) and %d (64 MiB), not %d", MinMaxBodyBytes, MaxMaxBodyBytes, w.MaxBodyBytes)
	}
}

func (c *Cron) validate(ps *problems, path string) {
	if strings.TrimSpace(c.Schedule) == "" {
		ps.add(path+".schedule", "is required (such as \"0 8 * * *\")")
	} else if _, err := ParseSchedule(c.Schedule); err != nil {
		ps.add(path+".schedule", "is not a valid cron schedule: %v", err)
	}
	if c.Timezone != "" {
		if _, err := time.LoadLocation(c.Timezone); err != nil || c.Timezone == "Local" {
			ps.add(path+".timezone", "is not a known IANA time zone: %q", c.Timezone)
		}
	}
	if c.CatchUp != "" && !slices.Contains(CatchUpPolicies, c.CatchUp) {
		ps.add(path+".catchUp", "must be one of %s, not %q", strings.Join(CatchUpPolicies, ", "), c.CatchUp)
	}
	if c.MaxCatchUp < 0 || c.MaxCatchUp > MaxMaxCatchUp {
		ps.add(path+".maxCatchUp", "must be between 1 and %d (0 for the default %d)", MaxMaxCatchUp, DefaultMaxCatchUp)
	}
}

// Location is the cron's zone (UTC when none is set).
func (c *Cron) Location() *time.Location {
	if c.Timezone == "" {
		return time.UTC
	}
	loc, err := time.LoadLocation(c.Timezone)
	if err != nil {
		return time.UTC
	}
	return loc
}

func (in *Inbox) validate(ps *problems) {
	if in == nil {
		return
	}
	if in.ReclaimAfter != 0 && in.ReclaimAfter < MinReclaimAfter {
		ps.add("inbox.reclaimAfter", "must be at least %s, not %s", MinReclaimAfter, in.ReclaimAfter)
	}
	if in.MaxDeliveries < 0 || in.MaxDeliveries > 100 {
		ps.add("inbox.maxDeliveries", "must be between 1 and 100 (0 for the default %d)", DefaultMaxDeliveries)
	}
	if in.PollFloor != 0 && in.PollFloor < MinPollFloor {
		ps.add("inbox.pollFloor", "must be at least %s, not %s", MinPollFloor, in.PollFloor)
	}
	if in.PollLease != 0 && in.PollLease < MinPollLease {
		ps.add("inbox.pollLease", "must be at least %s, not %s", MinPollLease, in.PollLease)
	}
	if in.PollMaxEvents < 0 || in.PollMaxEvents > MaxPollMaxEvents {
		ps.add("inbox.pollMaxEvents", "must be between 1 and %d (0 for the default %d)", MaxPollMaxEvents, DefaultPollMaxEvents)
	}
	if in.PollTimeout < 0 || in.PollTimeout > MaxPollTimeout {
		ps.add("inbox.pollTimeout", "must be between 1ms and %s (0 for the default %s), not %s", MaxPollTimeout, DefaultPollTimeout, in.PollTimeout)
	}
	if in.PollMaxAge != 0 && in.PollMaxAge < MinPollMaxAge {
		ps.add("inbox.pollMaxAge", "must be at least %s (0 for the default %s), not %s", MinPollMaxAge, DefaultPollMaxAge, in.PollMaxAge)
	}
	if in.HeartbeatTimeout != 0 && in.HeartbeatTimeout < MinHeartbeatWait {
		ps.add("inbox.heartbeatTimeout", "must be at least %s, not %s", MinHeartbeatWait, in.HeartbeatTimeout)
	}
	if in.LogSize < 0 || in.LogSize > 10_000 {
		ps.add("inbox.logSize", "must be between 1 and 10000 (0 for the default %d)", DefaultLogSize)
	}
}

// validateEvents checks the kinds that carry events: source, cron and
// webhooks on a connection.
func (c Connection) validateEvents(ps *problems, path string) {
	if c.Source != nil {
		c.Source.validate(ps, path+".source")
	}
	if c.Cron != nil {
		c.Cron.validate(ps, path+".cron")
	}
	if c.Webhooks != nil {
		if c.Cron != nil {
			ps.add(path+".webhooks", "cannot be set on a cron connection")
		}
		c.Webhooks.validate(ps, path+".webhooks")
	}
}

func (f *File) validateTriggers(ps *problems) {
	seen := map[string]int{}
	for i, t := range f.Triggers {
		path := fmt.Sprintf("triggers[%d]", i)
		switch first, dup := seen[t.ID]; {
		case !ValidName(t.ID):
			ps.add(path+".id", "must be a letter followed by letters, digits, '_' or '-', at most 64 characters")
		case dup:
			ps.add(path+".id", "%q is already the id of triggers[%d]", t.ID, first)
		default:
			seen[t.ID] = i
		}
		conn, ok := f.Connections[t.Connection]
		switch {
		case t.Connection == "":
			ps.add(path+".connection", "is required")
		case !ok:
			ps.add(path+".connection", "no connection named %q", t.Connection)
		case conn.Source != nil:
			if _, ok := conn.Source.Events[t.Event]; !ok {
				ps.add(path+".event", "source %q has no event %q (it has: %s)", t.Connection, t.Event, strings.Join(slices.Sorted(maps.Keys(conn.Source.Events)), ", "))
			}
		case conn.Cron != nil:
			if t.Event != CronEventTick {
				ps.add(path+".event", "a cron connection has one event, %q, not %q", CronEventTick, t.Event)
			}
		case conn.Webhooks != nil || conn.MCP != nil:
			// An MCP server's events are known once it has listed them:
			// the subscription checks the name and arguments then.
			if !ValidEventType(t.Event) {
				ps.add(path+".event", "must be an event type")
			}
		default:
			ps.add(path+".connection", "connection %q has no events (it is not a source, cron or mcp server and takes no webhooks)", t.Connection)
		}
		if t.Arguments != nil && (!ok || conn.MCP == nil) {
			ps.add(path+".arguments", "is only for a trigger on an mcp connection's event")
		}
		for field, src := range map[string]string{"filter": t.Filter, "thread": t.Thread} {
			if src == "" {
				continue
			}
			if _, err := CompileExpr(src); err != nil {
				ps.add(path+"."+field, "does not compile: %v", err)
			}
		}
		checkInputExprs(ps, path+".input", t.Input)
		switch w := t.Workflow.(type) {
		case nil:
			ps.add(path+".workflow", "is required: a file path or the document inline")
		case string:
			if w == "" {
				ps.add(path+".workflow", "is required: a file path or the document inline")
			}
		case map[string]any:
		default:
			ps.add(path+".workflow", "must be a file path or a workflow document (a mapping)")
		}
	}
}

func checkInputExprs(ps *problems, path string, v any) {
	switch x := v.(type) {
	case map[string]any:
		if src, ok := x["$expr"]; ok && len(x) == 1 {
			s, ok := src.(string)
			if !ok || s == "" {
				ps.add(path+".$expr", "must be a non-empty expression")
			} else if _, err := CompileExpr(s); err != nil {
				ps.add(path+".$expr", "does not compile: %v", err)
			}
			return
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			checkInputExprs(ps, path+"."+k, x[k])
		}
	case []any:
		for i, item := range x {
			checkInputExprs(ps, fmt.Sprintf("%s[%d]", path, i), item)
		}
	}
}

// loadWorkflows fills each trigger's Document: the inline document as
// JSON, or the file it names, relative to the config file's directory.
func (f *File) loadWorkflows(configPath string, readFile func(string) ([]byte, error), ps *problems) {
	for i := range f.Triggers {
		t := &f.Triggers[i]
		path := fmt.Sprintf("triggers[%d].workflow", i)
		switch w := t.Workflow.(type) {
		case map[string]any:
			data, err := json.Marshal(w)
			if err != nil {
				ps.add(path, "cannot be turned into JSON: %v", err)
				continue
			}
			t.Document = data
		case string:
			if w == "" {
				continue
			}
			file := w
			if !filepath.IsAbs(file) {
				file = filepath.Join(filepath.Dir(configPath), file)
			}
			data, err := readFile(file)
			if err != nil {
				ps.add(path, "cannot read the workflow file: %v", err)
				continue
			}
			// YAML is a superset of JSON, so a workflow file may be
			// either; it is stored as JSON.
			var doc any
			if err := yaml.Unmarshal(data, &doc); err != nil {
				ps.add(path, "cannot parse %s: %v", w, err)
				continue
			}
			if data, err = json.Marshal(doc); err != nil {
				ps.add(path, "%s cannot be turned into JSON: %v", w, err)
				continue
			}
			t.Document = data
		}
	}
}

// substituteWebhookSecrets replaces ${env:NAME} in webhook secrets, which
// belong in the environment rather than the file.
func (f *File) substituteWebhookSecrets(getenv func(string) string, ps *problems) {
	for _, name := range slices.Sorted(maps.Keys(f.Connections)) {
		w := f.Connections[name].Webhooks
		if w == nil {
			continue
		}
		for i := range w.Secrets {
			w.Secrets[i] = substituteString(w.Secrets[i], fmt.Sprintf("connections.%s.webhooks.secrets[%d]", name, i), getenv, ps)
		}
	}
}
