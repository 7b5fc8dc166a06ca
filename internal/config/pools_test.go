package config_test

import (
	"os"
	"testing"
	"time"
)

func TestLoadPool(t *testing.T) {
	t.Parallel()
	file := `
connections:
  browsers:
    mcp: { command: npx, args: ["@playwright/mcp", "--viewport-size=${setup.viewport}"] }
    pool:
      max: 4
      waitMs: 5000
      setup:
        schema:
          type: object
          properties:
            viewport: { type: string, pattern: "^[0-9]+x[0-9]+$", default: "1280x720" }
            profile: { type: string, default: /srv/profiles/a }
        hostOnly: [profile]
`
	c, err := load(env{"PATCHBAY_CONFIG": "/etc/pb.yaml"}, files{"/etc/pb.yaml": file})
	if err != nil {
		t.Fatal(err)
	}
	p := c.File.Connections["browsers"].Pool
	if p.Max != 4 || p.Wait() != 5*time.Second || p.Setup.HostOnly[0] != "profile" || len(p.Setup.Properties()) != 2 {
		t.Errorf("pool = %+v", p)
	}
	if got := c.File.Connections["browsers"].MCP.Args[1]; got != "--viewport-size=${setup.viewport}" {
		t.Errorf("args[1] = %q: ${setup.…} must be left for the pool", got)
	}
}

func TestPoolProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		pool  string
		mcp   bool
		wants []want
	}{
		{"no server", "{ max: 2 }", false, []want{{"connections.p", "exactly one kind"}, {"connections.p.pool", "needs an mcp server"}}},
		{"max zero", "{ max: 0 }", true, []want{{"connections.p.pool.max", "from 1 to 1024"}}},
		{"max too big", "{ max: 5000 }", true, []want{{"connections.p.pool.max", "from 1 to 1024"}}},
		{"negative wait", "{ max: 1, waitMs: -1 }", true, []want{{"connections.p.pool.waitMs", "from 0 to"}}},
		{"unknown field", "{ max: 1, size: 2 }", true, []want{{"connections.p.pool.size", "unknown field"}}},
		{"schema not object", "{ max: 1, setup: { schema: { type: string } } }", true, []want{{"connections.p.pool.setup.schema.type", `must be "object"`}}},
		{"host-only unknown", "{ max: 1, setup: { schema: { properties: { a: {} } }, hostOnly: [b] } }", true, []want{{"connections.p.pool.setup.hostOnly[0]", `"b" is not a property`}}},
		{"property not schema", "{ max: 1, setup: { schema: { properties: { a: 3 } } } }", true, []want{{"connections.p.pool.setup.schema.properties.a", "must be a schema"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			entry := "{ pool: " + tt.pool + " }"
			if tt.mcp {
				entry = "{ mcp: { command: x }, pool: " + tt.pool + " }"
			}
			_, err := load(env{"PATCHBAY_CONFIG": "/etc/pb.yaml"}, files{"/etc/pb.yaml": "connections:\n  p: " + entry + "\n"})
			checkProblems(t, err, tt.wants...)
		})
	}
}

func TestBrowsersExampleLoads(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/browsers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := load(env{"PATCHBAY_CONFIG": "/etc/pb.yaml"}, files{"/etc/pb.yaml": string(data)})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.File.Connections["browsers"].Pool; p == nil || p.Max != 4 {
		t.Fatalf("pool = %+v", p)
	}
}
