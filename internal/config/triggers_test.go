package config_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const goodSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestLoadTriggers(t *testing.T) {
	t.Parallel()
	file := `
connections:
  demo: { mcp: { command: x } }
  deploys:
    source: { events: { deploy.failed: { type: object, required: [service] } } }
    webhooks: { secrets: ["${env:HOOK_SECRET}", ` + goodSecret + `], dedupeFor: 240h, maxBodyBytes: 65536 }
  morning: { cron: { schedule: "0 8 * * *", timezone: America/New_York, catchUp: latest } }
triggers:
  - { id: daily, connection: morning, event: tick, workflow: workflows/daily.yaml }
  - id: failures
    connection: deploys
    event: deploy.failed
    filter: 'event.payload.service != "test"'
    thread: 'event.payload.service'
    input: { text: { $expr: 'event.payload.service' } }
    workflow: { version: 1, root: { kind: call, id: a, connection: demo, op: echo } }
inbox: { reclaimAfter: 10s, maxDeliveries: 3 }
`
	c, err := load(env{"PATCHBAY_CONFIG": "/etc/pb/pb.yaml", "HOOK_SECRET": goodSecret, "PATCHBAY_START_TRIGGERS": "false"},
		files{"/etc/pb/pb.yaml": file, "/etc/pb/workflows/daily.yaml": "version: 1\nroot: { kind: call, id: a, connection: demo, op: echo }\n"})
	if err != nil {
		t.Fatal(err)
	}
	if c.StartTriggers {
		t.Error("PATCHBAY_START_TRIGGERS=false ignored")
	}
	w := c.File.Connections["deploys"].Webhooks
	if w.Secrets[0] != goodSecret || w.DedupeFor != 240*time.Hour || w.MaxBodyBytes != 65536 {
		t.Errorf("webhooks = %+v", w)
	}
	if c.File.Connections["morning"].Cron.Location().String() != "America/New_York" {
		t.Errorf("cron = %+v", c.File.Connections["morning"].Cron)
	}
	for _, tr := range c.File.Triggers {
		var doc map[string]any
		if err := json.Unmarshal(tr.Document, &doc); err != nil || doc["version"] != 1.0 {
			t.Errorf("trigger %s document = %s (%v)", tr.ID, tr.Document, err)
		}
	}
	if c.File.Inbox.ReclaimAfter != 10*time.Second || c.File.Inbox.MaxDeliveries != 3 {
		t.Errorf("inbox = %+v", c.File.Inbox)
	}
}

func TestTriggerProblems(t *testing.T) {
	t.Parallel()
	file := `
connections:
  demo: { mcp: { command: x, subscribe: [{ event: "9x" }] } }
  src:
    source: { events: { "9bad": {}, ok: { type: nope } } }
    webhooks: { secrets: [whsec_c2hvcnQ=, "not-a-secret", "whsec_!!"], dedupeFor: 1m }
  cr: { cron: { schedule: "TZ=UTC 0 8 * * *", timezone: Mars/Olympus, catchUp: some }, webhooks: { secrets: [` + goodSecret + `] } }
  every: { cron: { schedule: "@every 1h" } }
  bad: { cron: { schedule: "61 * * * *" } }
triggers:
  - { id: a, connection: src, event: ok, filter: "event.(", workflow: missing.json }
  - { id: a, connection: cr, event: fire, input: { x: { $expr: "" } } }
  - { id: b, connection: demo, event: "9x", workflow: 3 }
  - { id: c, connection: ghost, event: x, workflow: {} }
  - { id: d, connection: src, event: ok, arguments: { a: 1 }, workflow: {} }
inbox: { reclaimAfter: 1ms, maxDeliveries: -1, pollFloor: 1ms, pollLease: 10ms, pollMaxEvents: 5000, pollTimeout: 10m, pollMaxAge: 10ms, heartbeatTimeout: 1ms }
`
	_, err := load(env{"PATCHBAY_CONFIG": "/etc/pb.yaml", "PATCHBAY_START_TRIGGERS": "maybe"}, files{"/etc/pb.yaml": file})
	checkProblems(t, err,
		want{"PATCHBAY_START_TRIGGERS", "true or false"},
		want{"connections.bad.cron.schedule", "not a valid cron schedule"},
		want{"connections.cr.cron.catchUp", "must be one of all, latest, none"},
		want{"connections.cr.cron.schedule", "timezone, not a TZ= prefix"},
		want{"connections.cr.cron.timezone", "not a known IANA time zone"},
		want{"connections.cr.webhooks", "cannot be set on a cron connection"},
		want{"connections.demo.mcp.subscribe[0].event", "must be an event type"},
		want{"connections.every.cron.schedule", "@every has no fixed slots"},
		want{"connections.src.source.events.9bad", "event type must be a letter"},
		want{"connections.src.source.events.ok", "not a valid JSON Schema"},
		want{"connections.src.webhooks.dedupeFor", "at least 1h0m0s"},
		want{"connections.src.webhooks.secrets[0]", "key must be 24 to 64 bytes, not 5"},
		want{"connections.src.webhooks.secrets[1]", `must start with "whsec_"`},
		want{"connections.src.webhooks.secrets[2]", "standard base64"},
		want{"inbox.heartbeatTimeout", "at least 100ms"},
		want{"inbox.maxDeliveries", "between 1 and 100"},
		want{"inbox.pollFloor", "at least 10ms"},
		want{"inbox.pollLease", "at least 1s"},
		want{"inbox.pollMaxAge", "at least 1s"},
		want{"inbox.pollMaxEvents", "between 1 and 1000"},
		want{"inbox.pollTimeout", "between 1ms and 5m0s"},
		want{"inbox.reclaimAfter", "at least 1s"},
		want{"triggers[0].filter", "does not compile"},
		want{"triggers[0].workflow", "cannot read the workflow file"},
		want{"triggers[1].event", `one event, "tick", not "fire"`},
		want{"triggers[1].id", `"a" is already the id of triggers[0]`},
		want{"triggers[1].input.x.$expr", "non-empty expression"},
		want{"triggers[1].workflow", "is required"},
		want{"triggers[2].event", "must be an event type"},
		want{"triggers[2].workflow", "must be a file path or a workflow document"},
		want{"triggers[3].connection", `no connection named "ghost"`},
		want{"triggers[4].arguments", "only for a trigger on an mcp connection"},
	)
	if strings.Contains(err.Error(), "not-a-secret") || strings.Contains(err.Error(), "c2hvcnQ") {
		t.Errorf("a problem quotes a secret:\n%v", err)
	}
}
