package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/config"
)

// env is a fake getenv.
type env map[string]string

func (e env) get(k string) string { return e[k] }

// files is a fake readFile.
type files map[string]string

func (f files) read(name string) ([]byte, error) {
	s, ok := f[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return []byte(s), nil
}

// want is an expected problem: the exact path and a part of the message.
type want struct{ path, msg string }

// checkProblems asserts err holds exactly the wanted problems, in order
// (problems are sorted by path).
func checkProblems(t *testing.T, err error, wants ...want) {
	t.Helper()
	if len(wants) == 0 {
		if err != nil {
			t.Fatalf("unexpected error:\n%v", err)
		}
		return
	}
	var ve *config.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error = %v (%T), want *config.ValidationError", err, err)
	}
	if len(ve.Problems) != len(wants) {
		t.Fatalf("got %d problems, want %d:\n%v", len(ve.Problems), len(wants), err)
	}
	for i, w := range wants {
		p := ve.Problems[i]
		if p.Path != w.path || !strings.Contains(p.Message, w.msg) {
			t.Errorf("problem %d = %q: %q, want %q: …%q…", i, p.Path, p.Message, w.path, w.msg)
		}
	}
}

func load(e env, f files) (*config.Config, error) {
	return config.Load(e.get, f.read)
}

func TestLoadEnvDefaults(t *testing.T) {
	t.Parallel()
	c, err := load(env{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := config.Default()
	if c.PprofAddr != "" {
		t.Errorf("PprofAddr = %q, want off by default", c.PprofAddr)
	}
	if c.Addr != "127.0.0.1:8080" || c.RedisPrefix != "pb:" || c.LogLevel != "info" || c.LogFormat != "text" ||
		c.Workers != min(32*runtime.GOMAXPROCS(0), 256) || c.Retention != 168*time.Hour || c.ClaimTimeout != 10*time.Second || c.MaxBodyBytes != 1<<20 || c.RedisURL != "" ||
		c.ConfigPath != "" || len(c.APIKeys) != 0 || len(c.File.Connections) != 0 {
		t.Errorf("defaults = %+v", c)
	}
	if c.Addr != def.Addr || c.Workers != def.Workers {
		t.Errorf("Default() disagrees with Load: %+v", def)
	}
	if err := def.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
}

func TestLoadEnv(t *testing.T) {
	t.Parallel()
	plain := "k-plain-1"
	digest := sha256.Sum256([]byte("k-hashed-2"))
	hexDigest := hex.EncodeToString(digest[:])

	tests := []struct {
		name  string
		env   env
		check func(t *testing.T, c *config.Config)
		wants []want
	}{
		{
			name: "all set",
			env: env{
				"PATCHBAY_ADDR": ":9090", "REDIS_URL": "redis://r:6379/1", "PATCHBAY_REDIS_PREFIX": "t1:",
				"PATCHBAY_SECRET_KEY": "s3cret", "PATCHBAY_ADMIN_TOKEN": "adm", "PATCHBAY_LOG_LEVEL": "DEBUG",
				"PATCHBAY_LOG_FORMAT": "json", "PATCHBAY_WORKERS": "256", "PATCHBAY_RETENTION": "1m",
				"PATCHBAY_MAX_BODY_BYTES": "1024",
			},
			check: func(t *testing.T, c *config.Config) {
				if c.Addr != ":9090" || c.RedisURL != "redis://r:6379/1" || c.RedisPrefix != "t1:" || c.SecretKey != "s3cret" ||
					c.AdminToken != "adm" || c.LogLevel != "debug" || c.LogFormat != "json" || c.Workers != 256 ||
					c.Retention != time.Minute || c.MaxBodyBytes != 1024 {
					t.Errorf("got %+v", c)
				}
				if c.SlogLevel() != slog.LevelDebug {
					t.Errorf("SlogLevel = %v", c.SlogLevel())
				}
			},
		},
		{
			name: "shutdown and gate-2 bounds",
			env:  env{"PATCHBAY_SHUTDOWN_GRACE": "2s", "PATCHBAY_SCHEMA_MAX_NODES": "500", "PATCHBAY_SCHEMA_COMPILE_TIMEOUT": "1m"},
			check: func(t *testing.T, c *config.Config) {
				if c.ShutdownGrace != 2*time.Second || c.SchemaMaxNodes != 500 || c.SchemaCompileTimeout != time.Minute {
					t.Errorf("got %s %d %s", c.ShutdownGrace, c.SchemaMaxNodes, c.SchemaCompileTimeout)
				}
				if d := config.Default(); d.ShutdownGrace != 30*time.Second || d.SchemaMaxNodes != 0 || d.SchemaCompileTimeout != 0 {
					t.Errorf("defaults %s %d %s", d.ShutdownGrace, d.SchemaMaxNodes, d.SchemaCompileTimeout)
				}
			},
		},
		{
			name:  "unparsable bounds",
			env:   env{"PATCHBAY_SHUTDOWN_GRACE": "soon", "PATCHBAY_SCHEMA_MAX_NODES": "many", "PATCHBAY_SCHEMA_COMPILE_TIMEOUT": "10"},
			wants: []want{{"PATCHBAY_SCHEMA_COMPILE_TIMEOUT", "duration"}, {"PATCHBAY_SCHEMA_MAX_NODES", "whole number"}, {"PATCHBAY_SHUTDOWN_GRACE", "duration"}},
		},
		{
			name: "secrets dir",
			env:  env{"PATCHBAY_SECRETS_DIR": "/run/secrets"},
			check: func(t *testing.T, c *config.Config) {
				if c.SecretsDir != "/run/secrets" {
					t.Errorf("SecretsDir = %q", c.SecretsDir)
				}
			},
		},
		{
			name: "api keys plain and sha256",
			env:  env{"PATCHBAY_API_KEYS": plain + ", sha256:" + hexDigest + ",,"},
			check: func(t *testing.T, c *config.Config) {
				if len(c.APIKeys) != 2 {
					t.Fatalf("APIKeys = %d, want 2", len(c.APIKeys))
				}
				if c.APIKeys[0].SHA256 != config.HashAPIKey(plain).SHA256 || c.APIKeys[1].SHA256 != digest ||
					c.APIKeys[0].Name != "env-1" || c.APIKeys[1].Allowlist != config.DefaultAllowlist {
					t.Errorf("APIKeys = %x", c.APIKeys)
				}
				for key, ok := range map[string]bool{plain: true, "k-hashed-2": true, "nope": false, "": false} {
					if got := c.MatchAPIKey(key); got != ok {
						t.Errorf("MatchAPIKey(%q) = %v, want %v", key, got, ok)
					}
				}
			},
		},
		{
			name: "api keys with roles",
			env:  env{"PATCHBAY_API_KEYS": "ops-key@admin, ci-key@run+read, sha256:" + hexDigest + "@approve, plain-key"},
			check: func(t *testing.T, c *config.Config) {
				want := [][]authz.Role{{authz.Admin}, {authz.Run, authz.Read}, {authz.Approve}, nil}
				if len(c.APIKeys) != len(want) {
					t.Fatalf("APIKeys = %d, want %d", len(c.APIKeys), len(want))
				}
				for i, k := range c.APIKeys {
					if !slices.Equal(k.Roles, want[i]) || k.Allowlist != config.DefaultAllowlist {
						t.Errorf("APIKeys[%d] roles = %v allowlist %q, want %v", i, k.Roles, k.Allowlist, want[i])
					}
				}
				if c.APIKeys[2].SHA256 != digest || !c.MatchAPIKey("ops-key") || c.MatchAPIKey("ops-key@admin") {
					t.Errorf("keys match what comes before '@': %x", c.APIKeys)
				}
			},
		},
		{
			name:  "bad roles on env keys",
			env:   env{"PATCHBAY_API_KEYS": "k1@Admin,@run,k3@run+"},
			wants: []want{{"PATCHBAY_API_KEYS[0]", "not a role name"}, {"PATCHBAY_API_KEYS[1]", "no key before"}, {"PATCHBAY_API_KEYS[2]", "not a role name"}},
		},
		{
			name:  "bad sha256 key",
			env:   env{"PATCHBAY_API_KEYS": "ok-key,sha256:abc,sha256:" + strings.Repeat("zz", 32)},
			wants: []want{{"PATCHBAY_API_KEYS[1]", "64 hex"}, {"PATCHBAY_API_KEYS[2]", "64 hex"}},
		},
		{
			name:  "unparsable numbers",
			env:   env{"PATCHBAY_WORKERS": "four", "PATCHBAY_RETENTION": "7d", "PATCHBAY_MAX_BODY_BYTES": "1MiB"},
			wants: []want{{"PATCHBAY_MAX_BODY_BYTES", "whole number"}, {"PATCHBAY_RETENTION", "duration"}, {"PATCHBAY_WORKERS", "whole number"}},
		},
		{
			name: "out of range, all at once",
			env: env{
				"PATCHBAY_ADDR": "localhost", "PATCHBAY_LOG_LEVEL": "trace", "PATCHBAY_LOG_FORMAT": "xml",
				"PATCHBAY_WORKERS": "257", "PATCHBAY_RETENTION": "59s", "PATCHBAY_MAX_BODY_BYTES": "1023",
				"PATCHBAY_REDIS_PREFIX": "{pb}:", "PATCHBAY_PUBLIC_URL": "ftp://u:p@host/x",
			},
			wants: []want{
				{"PATCHBAY_ADDR", "host:port"},
				{"PATCHBAY_LOG_FORMAT", "text, json"},
				{"PATCHBAY_LOG_LEVEL", "debug, info, warn, error"},
				{"PATCHBAY_MAX_BODY_BYTES", "between 1024"},
				{"PATCHBAY_PUBLIC_URL", "http or https"},
				{"PATCHBAY_REDIS_PREFIX", "braces"},
				{"PATCHBAY_RETENTION", "at least 1m0s"},
				{"PATCHBAY_WORKERS", "between 1 and 256"},
			},
		},
		{
			name:  "workers zero and body too big",
			env:   env{"PATCHBAY_WORKERS": "0", "PATCHBAY_MAX_BODY_BYTES": "67108865"},
			wants: []want{{"PATCHBAY_MAX_BODY_BYTES", "64 MiB"}, {"PATCHBAY_WORKERS", "not 0"}},
		},
		{
			name: "pprof on loopback",
			env:  env{"PATCHBAY_PPROF_ADDR": "127.0.0.1:6060"},
			check: func(t *testing.T, c *config.Config) {
				if c.PprofAddr != "127.0.0.1:6060" {
					t.Errorf("PprofAddr = %q", c.PprofAddr)
				}
			},
		},
		{name: "pprof on ::1", env: env{"PATCHBAY_PPROF_ADDR": "[::1]:6060"}},
		{
			name: "trace URL template",
			env:  env{"PATCHBAY_TRACE_URL": "https://jaeger.example/trace/{traceId}"},
			check: func(t *testing.T, c *config.Config) {
				if c.TraceURL != "https://jaeger.example/trace/{traceId}" {
					t.Errorf("TraceURL = %q", c.TraceURL)
				}
			},
		},
		{name: "trace URL without {traceId}", env: env{"PATCHBAY_TRACE_URL": "https://jaeger.example/search"}, wants: []want{{"PATCHBAY_TRACE_URL", "{traceId}"}}},
		{name: "trace URL not http", env: env{"PATCHBAY_TRACE_URL": "javascript:alert({traceId})"}, wants: []want{{"PATCHBAY_TRACE_URL", "http or https"}}},
		{name: "pprof on localhost", env: env{"PATCHBAY_PPROF_ADDR": "localhost:0"}},
		{
			name:  "pprof on every interface",
			env:   env{"PATCHBAY_PPROF_ADDR": ":6060"},
			wants: []want{{"PATCHBAY_PPROF_ADDR", "loopback"}},
		},
		{
			name:  "pprof on a public address",
			env:   env{"PATCHBAY_PPROF_ADDR": "10.0.0.5:6060"},
			wants: []want{{"PATCHBAY_PPROF_ADDR", "loopback"}},
		},
		{
			name:  "pprof without a port",
			env:   env{"PATCHBAY_PPROF_ADDR": "127.0.0.1"},
			wants: []want{{"PATCHBAY_PPROF_ADDR", "host:port"}},
		},
		{
			name:  "bad port",
			env:   env{"PATCHBAY_ADDR": "127.0.0.1:http"},
			wants: []want{{"PATCHBAY_ADDR", "port must be a number"}},
		},
		{
			name:  "missing config file",
			env:   env{"PATCHBAY_CONFIG": "/nope.yaml"},
			wants: []want{{"PATCHBAY_CONFIG", "cannot read"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := load(tt.env, nil)
			checkProblems(t, err, tt.wants...)
			if err != nil && c != nil {
				t.Errorf("Load returned a config with an error")
			}
			if tt.check != nil && c != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestLoadErrorHidesSecrets(t *testing.T) {
	t.Parallel()
	_, err := load(env{"PATCHBAY_API_KEYS": "sha256:hunter2hunter2", "PATCHBAY_WORKERS": "x"}, nil)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	const mcpFields = "args, command, cwd, env, headers, maxResponseBytes, name, requestTimeoutMs, subscribe, timeoutMs, type, url"
	tests := []struct {
		name  string
		file  string
		env   env
		check func(t *testing.T, f config.File)
		wants []want
	}{
		{
			name: "stdio and http",
			file: `
name: ops
connections:
  demo: { mcp: { command: ./bin/demo-mcp, args: [--x, "${env:ARG}"], env: { TOKEN: "${env:TOK}" }, cwd: /srv } }
  remote:
    mcp:
      type: http
      url: https://${env:HOST}/mcp
      headers: { Authorization: "Bearer ${env:TOK}" }
      timeoutMs: 1000
      requestTimeoutMs: 0
`,
			env: env{"ARG": "a1", "TOK": "t0k", "HOST": "mcp.example.com"},
			check: func(t *testing.T, f config.File) {
				d, r := f.Connections["demo"].MCP, f.Connections["remote"].MCP
				if f.Name != "ops" || d.Command != "./bin/demo-mcp" || d.Args[1] != "a1" || d.Env["TOKEN"] != "t0k" || d.Cwd != "/srv" {
					t.Errorf("demo = %+v", d)
				}
				if r.URL != "https://mcp.example.com/mcp" || r.Headers["Authorization"] != "Bearer t0k" || r.TimeoutMs != 1000 || r.Transport() != "http" {
					t.Errorf("remote = %+v", r)
				}
				if k := f.Connections["demo"].Kind(); k != "mcp" {
					t.Errorf("Kind = %q", k)
				}
			},
		},
		{
			name: "json",
			file: "{\n\t\"connections\": {\n\t\t\"demo\": {\"mcp\": {\"command\": \"x\", \"args\": [\"a\"]}}\n\t}\n}\n",
			check: func(t *testing.T, f config.File) {
				if m := f.Connections["demo"].MCP; m == nil || m.Command != "x" || m.Args[0] != "a" {
					t.Errorf("demo = %+v", m)
				}
			},
		},
		{
			name:  "empty file",
			file:  "",
			check: func(t *testing.T, f config.File) {},
		},
		{
			name:  "unknown fields",
			file:  "nmae: x\nconnections:\n  demo:\n    mcp: { command: x, comand: y }\n    polcy: {}\n",
			wants: []want{{"connections.demo.mcp.comand", "unknown field (line 4); expected one of: " + mcpFields}, {"connections.demo.polcy", "unknown field (line 5)"}, {"nmae", "unknown field (line 1)"}},
		},
		{
			name:  "unknown field in json",
			file:  `{"connections": {"demo": {"mcp": {"command": "x", "bogus": true}}}}`,
			wants: []want{{"connections.demo.mcp.bogus", "unknown field"}},
		},
		{
			name:  "wrong types",
			file:  "connections:\n  demo:\n    mcp: { command: [x], args: x, timeoutMs: soon, env: [a] }\ntriggers: {}\n",
			wants: []want{{"connections.demo.mcp.args", "must be a list, not a string"}, {"connections.demo.mcp.command", "must be a string, not a list"}, {"connections.demo.mcp.env", "must be a mapping"}, {"connections.demo.mcp.timeoutMs", "must be a whole number"}, {"triggers", "must be a list"}},
		},
		{
			name:  "duplicate key",
			file:  "connections:\n  demo: { mcp: { command: x } }\n  demo: { mcp: { command: y } }\n",
			wants: []want{{"connections.demo", "given twice (lines 2 and 3)"}},
		},
		{
			name:  "unset env",
			file:  "connections:\n  demo: { mcp: { command: \"${env:NOPE}\", args: [\"${env:ALSO_NOPE}\", \"${env:bad-name}\"] } }\n",
			wants: []want{{"connections.demo.mcp.args[0]", "ALSO_NOPE is not set"}, {"connections.demo.mcp.args[1]", "not a valid environment variable name"}, {"connections.demo.mcp.command", "NOPE is not set"}},
		},
		{
			name:  "secret and unknown references",
			file:  "connections:\n  r: { mcp: { url: \"https://h/${secret:K}\", headers: { X-A: \"${vault:K}\" } } }\n",
			wants: []want{{"connections.r.mcp.headers.X-A", "unknown reference kind"}, {"connections.r.mcp.url", "secrets are not supported yet"}},
		},
		{
			name: "no substitution outside mcp strings or of substituted text",
			file: "name: \"${env:X}\"\nconnections:\n  d: { mcp: { command: \"${env:X}-${env:Y}\", cwd: \"$HOME/${X}\" } }\n",
			env:  env{"X": "${env:Y}", "Y": "y"},
			check: func(t *testing.T, f config.File) {
				if f.Name != "${env:X}" || f.Connections["d"].MCP.Command != "${env:Y}-y" || f.Connections["d"].MCP.Cwd != "$HOME/${X}" {
					t.Errorf("got %q %+v", f.Name, f.Connections["d"].MCP)
				}
			},
		},
		{
			name:  "syntax error",
			file:  "connections: [\n",
			wants: []want{{"PATCHBAY_CONFIG", "cannot parse /etc/pb.yaml"}},
		},
		{
			name:  "two documents",
			file:  "name: a\n---\nname: b\n",
			wants: []want{{"PATCHBAY_CONFIG", "exactly one YAML document"}},
		},
		{
			name: "merge keys",
			file: "connections:\n  a: &a { mcp: { command: x } }\n  b: { <<: *a }\n",
			check: func(t *testing.T, f config.File) {
				if f.Connections["b"].MCP == nil || f.Connections["b"].MCP.Command != "x" {
					t.Errorf("b = %+v", f.Connections["b"])
				}
			},
		},
		{
			name: "many problems at once",
			file: `
connections:
  9lives: { mcp: { command: x } }
  both: { mcp: { command: x, url: "https://h" } }
  none: {}
  deploys: { source: { events: {} }, webhooks: { secrets: [a] } }
  two: { mcp: { command: x }, cron: { schedule: "0 8 * * *" } }
  remote: { mcp: { type: http, url: "${env:NOPE}" }, auth: oauth, policy: { deny: ["admin.*"] }, pool: { max: 0 }, extra: 1 }
triggers:
  - { id: daily, connection: two, event: tick }
`,
			env: env{"PATCHBAY_WORKERS": "0"},
			wants: []want{
				{"PATCHBAY_WORKERS", "between 1 and 256"},
				{"connections.9lives", "name must be a letter"},
				{"connections.both.mcp", "both command (stdio) and url (http)"},
				{"connections.deploys.source.events", "at least one event type"},
				{"connections.deploys.webhooks.secrets[0]", `must start with "whsec_"`},
				{"connections.none", "exactly one kind"},
				{"connections.remote.extra", "unknown field"},
				{"connections.remote.mcp.url", "NOPE is not set"},
				{"connections.remote.pool.max", "from 1 to"},
				{"connections.two", "exactly one kind, has mcp and cron"},
				{"triggers[0].workflow", "is required"},
			},
		},
		{
			name: "openapi",
			file: `
connections:
  github:
    openapi:
      url: https://raw.example.com/api.yaml
      baseUrl: https://api.example.com
      headers: { Authorization: "Bearer ${env:GH_TOKEN}", X-Other: "t=${secret:gh.other}" }
      include: [issues, pulls/get, { $expr: "method == 'GET' && 'repos' in tags" }]
      docAuth: false
      followRedirects: any
    policy: { approve: ["issues/create"] }
    determinism: costly
`,
			env: env{"GH_TOKEN": "ghp_123"},
			check: func(t *testing.T, f config.File) {
				c := f.Connections["github"]
				o := c.OpenAPI
				if c.Kind() != "openapi" || o.Headers["Authorization"] != "Bearer ghp_123" || o.Headers["X-Other"] != "t=${secret:gh.other}" || o.DocAuth == nil || *o.DocAuth || c.Determinism != "costly" || o.FollowRedirects != "any" ||
					!reflect.DeepEqual(o.Include, []config.Include{{Name: "issues"}, {Name: "pulls/get"}, config.IncludeExpr("method == 'GET' && 'repos' in tags")}) {
					t.Errorf("github = %+v %+v", c, o)
				}
			},
		},
		{
			name: "openapi problems",
			file: `
connections:
  a: { openapi: { baseUrl: "ftp://x", headers: { "bad header": v }, include: ["", { $expr: "method ==" }, { $expr: "path" }, { $expr: "nope == 1" }, { expr: x }, [x]], timeoutMs: -1, maxSchemaNodes: -1, maxOperations: -2, followRedirects: always } }
  b: { openapi: { url: "gopher://x" }, pool: { max: 2 }, auth: oauth }
  c: { openapi: { url: ./api.yaml, headers: { X-Key: "${env:NOPE}", X-Bad: "${secret:a b}" } }, mcp: { command: x } }
`,
			wants: []want{
				{"connections.a.openapi.baseUrl", "absolute http:// or https:// URL"},
				{"connections.a.openapi.followRedirects", `none, same-origin (the default) or any, not "always"`},
				{"connections.a.openapi.headers.bad header", "not a valid HTTP header name"},
				{"connections.a.openapi.include[0]", "not empty"},
				{"connections.a.openapi.include[1].$expr", "not a valid include expression"},
				{"connections.a.openapi.include[2].$expr", "expected bool"},
				{"connections.a.openapi.include[3].$expr", "unknown name nope"},
				{"connections.a.openapi.include[4].$expr", "is required"},
				{"connections.a.openapi.include[4].expr", "unknown field"},
				{"connections.a.openapi.include[5]", "must be a mapping, not a list"},
				{"connections.a.openapi.maxOperations", "must not be negative"},
				{"connections.a.openapi.maxSchemaNodes", "must not be negative"},
				{"connections.a.openapi.timeoutMs", "must not be negative"},
				{"connections.a.openapi.url", "is required"},
				{"connections.b.auth", "needs openapi.baseUrl"},
				{"connections.b.openapi.url", "file path"},
				{"connections.b.pool", "needs an mcp server"},
				{"connections.c", "exactly one kind, has mcp and openapi"},
				{"connections.c.openapi.headers.X-Bad", "not a valid secret name"},
				{"connections.c.openapi.headers.X-Key", "NOPE is not set"},
			},
		},
		{
			name: "a key given twice",
			file: `
apiKeys:
  - { name: dev, key: dev-key, allowlist: default, roles: [admin] }
`,
			env:   env{"PATCHBAY_API_KEYS": "dev-key"},
			wants: []want{{"apiKeys", `keys "env-1" and "dev" are the same key`}},
		},
		{
			name: "a file key named like an environment key",
			file: `
apiKeys:
  - { name: ci, key: ci-key, allowlist: default }
  - { name: ops, key: ops-key, allowlist: default }
  - { name: env-1, key: other-key, allowlist: default }
`,
			env:   env{"PATCHBAY_API_KEYS": "env-key"},
			wants: []want{{"apiKeys[2].name", `"env-1" is reserved: it is the name of PATCHBAY_API_KEYS[0]`}},
		},
		{
			name: "roles from the file",
			file: `
apiKeys:
  - { name: sam, key: sam-key, allowlist: ops, roles: [approve, oncall], approve: ["prod.*"] }
`,
			check: func(t *testing.T, f config.File) {
				if k := f.APIKeys[0]; k.Roles[1] != "oncall" || k.Approve[0] != "prod.*" {
					t.Errorf("key = %+v", k)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := env{"PATCHBAY_CONFIG": "/etc/pb.yaml"}
			for k, v := range tt.env {
				e[k] = v
			}
			c, err := load(e, files{"/etc/pb.yaml": tt.file})
			checkProblems(t, err, tt.wants...)
			if err == nil && tt.check != nil {
				tt.check(t, c.File)
			}
		})
	}
}

func TestLoadProblemsDoNotQuoteValues(t *testing.T) {
	t.Parallel()
	file := "connections:\n  r: { mcp: { type: http, url: \"ftp://${env:TOK}@h\", headers: { A: \"${env:TOK}\", a: \"x\", \"B\": \"v\\nw\" } } }\n  s: { mcp: { command: [sekrit] } }\n"
	_, err := load(env{"PATCHBAY_CONFIG": "f", "TOK": "sekrit"}, files{"f": file})
	checkProblems(t, err,
		want{"connections.r.mcp.headers.B", "line breaks"},
		want{"connections.r.mcp.headers.a", `repeats header "A"`},
		want{"connections.r.mcp.url", "absolute http:// or https://"},
		want{"connections.s.mcp.command", "must be a string"},
	)
	if strings.Contains(err.Error(), "sekrit") {
		t.Errorf("error quotes a value:\n%v", err)
	}
}

func mcpConn(m config.MCP) config.Connection { return config.Connection{MCP: &m} }

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		edit  func(c *config.Config)
		wants []want
	}{
		{name: "defaults", edit: func(c *config.Config) {}},
		{name: "valid stdio", edit: func(c *config.Config) {
			c.File.Connections = map[string]config.Connection{"demo_1-x": mcpConn(config.MCP{Name: "demo_1-x", Type: "stdio", Command: "x", Args: []string{"a"}, Env: map[string]string{"A": "b"}, Cwd: "/"})}
		}},
		{name: "valid http", edit: func(c *config.Config) {
			c.File.Connections = map[string]config.Connection{"r": mcpConn(config.MCP{URL: "http://127.0.0.1:3000/mcp", Headers: map[string]string{"X-A": "1", "X-B": "2"}, TimeoutMs: 1, RequestTimeoutMs: 2})}
		}},
		{name: "addr with empty host", edit: func(c *config.Config) { c.Addr = ":0" }},
		{name: "addr ipv6", edit: func(c *config.Config) { c.Addr = "[::1]:8080" }},
		{
			name:  "addr without port",
			edit:  func(c *config.Config) { c.Addr = "[::1]" },
			wants: []want{{"PATCHBAY_ADDR", "host:port"}},
		},
		{
			name:  "addr port out of range",
			edit:  func(c *config.Config) { c.Addr = "h:65536" },
			wants: []want{{"PATCHBAY_ADDR", "0 to 65535"}},
		},
		{
			name: "zero config",
			edit: func(c *config.Config) {
				*c = config.Config{Addr: "h:1", RedisPrefix: "p:", LogLevel: "warn", LogFormat: "json"}
			},
			wants: []want{
				{"PATCHBAY_AUTH_BACKOFF", "from 10ms to 24h"}, {"PATCHBAY_AUTH_BACKOFF_MAX", "from 10ms to 24h"},
				{"PATCHBAY_AUTH_FAILURES", "between 1"},
				{"PATCHBAY_CLAIM_TIMEOUT", "from 1s to 1h"}, {"PATCHBAY_IDLE_TIMEOUT", "from 10ms"},
				{"PATCHBAY_MAX_BODY_BYTES", "between"}, {"PATCHBAY_MAX_CONNS", "between 1"},
				{"PATCHBAY_MAX_CONNS_PER_ADDRESS", "between 1"}, {"PATCHBAY_MAX_HEADER_BYTES", "between 4096"},
				{"PATCHBAY_MAX_STREAMS", "between 1"}, {"PATCHBAY_MAX_STREAMS_PER_PRINCIPAL", "between 1"},
				{"PATCHBAY_MCP_CALLS_PER_PRINCIPAL", "between 1"}, {"PATCHBAY_MCP_SESSIONS_PER_PRINCIPAL", "between 1"}, {"PATCHBAY_MCP_SESSION_IDLE", "from 1m"},
				{"PATCHBAY_POOL_RECLAIM_AFTER", "from 100ms to 24h"}, {"PATCHBAY_QUESTION_HOLD", "from 1s"}, {"PATCHBAY_READ_HEADER_TIMEOUT", "from 10ms"},
				{"PATCHBAY_READ_TIMEOUT", "from 10ms"}, {"PATCHBAY_RETENTION", "at least"},
				{"PATCHBAY_SHUTDOWN_GRACE", "from 100ms to 10m"}, {"PATCHBAY_WORKERS", "between"},
				{"PATCHBAY_WRITE_TIMEOUT", "from 10ms"},
			},
		},
		{
			name: "bounds out of range",
			edit: func(c *config.Config) {
				c.ShutdownGrace, c.SchemaMaxNodes, c.SchemaCompileTimeout = time.Hour, -1, 2*time.Hour
			},
			wants: []want{
				{"PATCHBAY_SCHEMA_COMPILE_TIMEOUT", "at most 1h"}, {"PATCHBAY_SCHEMA_MAX_NODES", "from 1 to 10000000"},
				{"PATCHBAY_SHUTDOWN_GRACE", "from 100ms to 10m"},
			},
		},
		{
			name: "names",
			edit: func(c *config.Config) {
				ok := mcpConn(config.MCP{Command: "x"})
				c.File.Connections = map[string]config.Connection{
					"a":                     ok,
					strings.Repeat("a", 64): ok,
					strings.Repeat("b", 65): ok,
					"_x":                    ok,
					"x.y":                   ok,
					"":                      ok,
					"é":                     ok,
				}
			},
			wants: []want{{"connections.", "name must"}, {"connections._x", "name must"}, {"connections." + strings.Repeat("b", 65), "name must"}, {"connections.x.y", "name must"}, {"connections.é", "name must"}},
		},
		{
			name: "mcp type",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{"a": mcpConn(config.MCP{Type: "websocket", URL: "https://h", MaxResponseBytes: 10})}
			},
			wants: []want{{"connections.a.mcp.maxResponseBytes", "at least 1024"}, {"connections.a.mcp.type", `not "websocket"`}},
		},
		{
			name: "stdio rules",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{
					"a": mcpConn(config.MCP{}),
					"b": mcpConn(config.MCP{Type: "stdio", Command: " ", URL: "https://h", Headers: map[string]string{"A": "b"}, Env: map[string]string{"A=B": "c"}}),
				}
			},
			wants: []want{{"connections.a.mcp.command", "required"}, {"connections.b.mcp.command", "required"}, {"connections.b.mcp.env.A=B", "not a valid environment variable name"}, {"connections.b.mcp.headers", "not allowed"}, {"connections.b.mcp.url", "not allowed"}},
		},
		{
			name: "http rules",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{
					"a": mcpConn(config.MCP{Type: "http"}),
					"b": mcpConn(config.MCP{Type: "http", URL: "/mcp", Command: "x", Args: []string{"y"}, Env: map[string]string{"A": "b"}, Cwd: "/"}),
					"c": mcpConn(config.MCP{URL: "ws://h/mcp"}),
					"d": mcpConn(config.MCP{URL: "https:///mcp"}),
				}
			},
			wants: []want{
				{"connections.a.mcp.url", "required"},
				{"connections.b.mcp.args", "not allowed"}, {"connections.b.mcp.command", "not allowed"}, {"connections.b.mcp.cwd", "not allowed"}, {"connections.b.mcp.env", "not allowed"}, {"connections.b.mcp.url", "absolute"},
				{"connections.c.mcp.url", "absolute"},
				{"connections.d.mcp.url", "absolute"},
			},
		},
		{
			name: "mcp name and timeouts",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{"a": mcpConn(config.MCP{Name: "b", Command: "x", TimeoutMs: -1, RequestTimeoutMs: -5})}
			},
			wants: []want{{"connections.a.mcp.name", `must equal the connection's key "a"`}, {"connections.a.mcp.requestTimeoutMs", "negative"}, {"connections.a.mcp.timeoutMs", "negative"}},
		},
		{
			name: "headers",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{"a": mcpConn(config.MCP{URL: "https://h", Headers: map[string]string{"X-A": "1", "x-a": "2", "X-a": "3", "Bad Name": "4", "": "5"}})}
			},
			wants: []want{{"connections.a.mcp.headers.", "not a valid HTTP header name"}, {"connections.a.mcp.headers.Bad Name", "not a valid HTTP header name"}, {"connections.a.mcp.headers.X-a", `repeats header "X-A"`}, {"connections.a.mcp.headers.x-a", `repeats header "X-A"`}},
		},
		{
			name: "kinds",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{
					"none":  {Policy: &config.Policy{Deny: []string{"admin.*", "[bad"}, Allow: []string{"[worse"}}},
					"src":   {Source: &config.Source{Events: map[string]any{"a.b": map[string]any{"type": "object"}}}},
					"three": {MCP: &config.MCP{Command: "x"}, Source: &config.Source{Events: map[string]any{"x": true}}, Cron: &config.Cron{Schedule: "@daily"}},
					"auth":  {Source: &config.Source{Events: map[string]any{"x": true}}, Auth: &config.Auth{OAuth: &config.OAuth{}}},
				}
			},
			wants: []want{
				{"connections.auth.auth", "only supported on an mcp connection"},
				{"connections.none", "exactly one kind: mcp, openapi, drive, source or cron"},
				{"connections.none.policy.allow[0]", `"[worse" is not a valid glob`},
				{"connections.none.policy.deny[1]", `"[bad" is not a valid glob`},
				{"connections.three", "has mcp and source and cron"},
			},
		},
		{
			name: "api keys",
			edit: func(c *config.Config) {
				c.File.APIKeys = []config.FileAPIKey{{Name: "ci", Key: "k", SHA256: "ab", Allowlist: "ci"}, {Key: "k2"}}
			},
			wants: []want{
				{"apiKeys[0]", "exactly one of key and sha256"},
				{"apiKeys[0].sha256", "64 hex digits"},
				{"apiKeys[1].allowlist", "is required"},
				{"apiKeys[1].name", "is required"},
			},
		},
		{
			name: "api key names: one principal per name",
			edit: func(c *config.Config) {
				key := func(name string) config.FileAPIKey {
					return config.FileAPIKey{Name: name, Key: "key-of-" + name, Allowlist: "a"}
				}
				c.File.APIKeys = []config.FileAPIKey{key("ci"), key("ops"), key("ci"), key("ci"),
					key("admin"), key("trigger"), key("generated"), key("env-1"), key("env-007"), key("env-x")}
			},
			wants: []want{
				{"apiKeys[2].name", `"ci" is also the name of apiKeys[0]`},
				{"apiKeys[3].name", `"ci" is also the name of apiKeys[0]`},
				{"apiKeys[4].name", `"admin" is reserved: the operator's`},
				{"apiKeys[5].name", `"trigger" is reserved: the principal of host-trusted runs`},
				{"apiKeys[6].name", `"generated" is reserved: the key made for a run`},
				{"apiKeys[7].name", `"env-1" is reserved: it is the name of PATCHBAY_API_KEYS[0]`},
				{"apiKeys[8].name", `"env-007" is reserved: names env-<n>`},
			},
		},
		{
			name: "api key roles and grants",
			edit: func(c *config.Config) {
				c.File.Connections = map[string]config.Connection{
					"demo":    {MCP: &config.MCP{Command: "x"}, Policy: &config.Policy{Approvers: []string{"sam", "role:On Call"}}},
					"deploys": {Source: &config.Source{Events: map[string]any{"x": true}}},
				}
				c.File.APIKeys = []config.FileAPIKey{{Name: "patchbay", Key: "k", Allowlist: "a",
					Roles: []string{"admin", "Root"}, Approve: []string{"[bad"}, Push: []string{"deploys", "demo"}}}
			},
			wants: []want{
				{"apiKeys[0].approve[0]", "not a valid glob"},
				{"apiKeys[0].name", `"patchbay" is reserved`},
				{"apiKeys[0].push[1]", `"demo" is not a source connection`},
				{"apiKeys[0].roles[1]", `"Root" is not a role name`},
				{"connections.demo.policy.approvers[1]", "role:<role>"},
			},
		},
		{
			name: "triggers",
			edit: func(c *config.Config) { c.File.Triggers = []config.Trigger{{ID: "x"}} },
			wants: []want{
				{"triggers[0].connection", "is required"},
				{"triggers[0].workflow", "is required"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			tt.edit(c)
			checkProblems(t, c.Validate(), tt.wants...)
		})
	}
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"a": true, "A9_-": true, strings.Repeat("z", 64): true,
		"": false, "9a": false, "-a": false, "a b": false, "a.b": false, strings.Repeat("z", 65): false, "a\n": false,
	} {
		if got := config.ValidName(name); got != ok {
			t.Errorf("ValidName(%q) = %v, want %v", name, got, ok)
		}
	}
}

func TestValidationErrorText(t *testing.T) {
	t.Parallel()
	err := &config.ValidationError{Problems: []config.Problem{{Path: "a.b", Message: "bad"}, {Path: "C", Message: "worse"}, {Message: "whole"}}}
	if got, want := err.Error(), "a.b: bad\nC: worse\nwhole"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestLogHelpers(t *testing.T) {
	t.Parallel()
	for level, want := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		c := config.Default()
		c.LogLevel = level
		if got := c.SlogLevel(); got != want {
			t.Errorf("SlogLevel(%s) = %v", level, got)
		}
	}
	var b strings.Builder
	c := config.Default()
	c.LogFormat = "json"
	slog.New(c.LogHandler(&b)).Debug("hidden")
	slog.New(c.LogHandler(&b)).Info("shown")
	if s := b.String(); strings.Contains(s, "hidden") || !strings.HasPrefix(s, `{"time"`) {
		t.Errorf("log = %q", s)
	}
}

func TestLoadAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		conn  string // the YAML of connections.r
		check func(t *testing.T, c config.Connection)
		wants []want
	}{
		{
			name: "word",
			conn: `{ mcp: { url: "https://h/mcp" }, auth: oauth, requiresPrincipal: true }`,
			check: func(t *testing.T, c config.Connection) {
				if c.Auth == nil || c.Auth.OAuth == nil || c.Auth.PerUser || !c.RequiresPrincipal {
					t.Errorf("conn = %+v auth = %+v", c, c.Auth)
				}
			},
		},
		{
			name: "mapping",
			conn: `{ mcp: { type: sse, url: "https://h/sse" }, auth: { oauth: { clientId: "${env:CID}", clientSecret: "${env:CSEC}", scopes: [read, write] }, perUser: true } }`,
			check: func(t *testing.T, c config.Connection) {
				o := c.Auth.OAuth
				if !c.Auth.PerUser || o.ClientID != "cid-1" || o.ClientSecret != "sekrit-1" || strings.Join(o.Scopes, " ") != "read write" {
					t.Errorf("auth = %+v oauth = %+v", c.Auth, o)
				}
			},
		},
		{
			name: "empty oauth mapping",
			conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: {} } }`,
			check: func(t *testing.T, c config.Connection) {
				if c.Auth.OAuth == nil || c.Auth.PerUser {
					t.Errorf("auth = %+v", c.Auth)
				}
			},
		},
		{name: "other word", conn: `{ mcp: { url: "https://h/mcp" }, auth: basic }`, wants: []want{{"connections.r.auth", `must be oauth or a mapping`}}},
		{name: "perUser without oauth", conn: `{ mcp: { url: "https://h/mcp" }, auth: { perUser: true } }`, wants: []want{{"connections.r.auth", "needs oauth or githubApp"}}},
		{name: "unknown field", conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: { client_id: x } } }`, wants: []want{{"connections.r.auth.oauth.client_id", "unknown field"}}},
		{name: "wrong kind", conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: { scopes: read } } }`, wants: []want{{"connections.r.auth.oauth.scopes", "must be a list"}}},
		{name: "stdio", conn: `{ mcp: { command: x }, auth: oauth }`, wants: []want{{"connections.r.auth", "not allowed for a stdio server"}}},
		{
			name:  "with an Authorization header",
			conn:  `{ mcp: { url: "https://h/mcp", headers: { authorization: "Bearer ${env:CSEC}" } }, auth: oauth }`,
			wants: []want{{"connections.r.auth", "cannot be combined with an Authorization header (mcp.headers.authorization)"}},
		},
		{name: "secret without id", conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: { clientSecret: s } } }`, wants: []want{{"connections.r.auth.oauth.clientSecret", "needs clientId"}}},
		{name: "bad scope", conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: { scopes: ["a b", ""] } } }`, wants: []want{{"connections.r.auth.oauth.scopes[0]", "one scope token"}, {"connections.r.auth.oauth.scopes[1]", "one scope token"}}},
		{
			name: "openapi per user",
			conn: `{ openapi: { url: "https://h/openapi.json", headers: { X-Team: t } }, auth: { oauth: { scopes: [repo] }, perUser: true }, requiresPrincipal: true }`,
			check: func(t *testing.T, c config.Connection) {
				if c.OpenAPI == nil || c.Auth == nil || !c.Auth.PerUser || !c.RequiresPrincipal || strings.Join(c.Auth.OAuth.Scopes, " ") != "repo" {
					t.Errorf("conn = %+v auth = %+v", c, c.Auth)
				}
			},
		},
		{name: "openapi file with baseUrl", conn: `{ openapi: { url: ./api.yaml, baseUrl: "https://api.h" }, auth: oauth }`},
		{name: "openapi file without baseUrl", conn: `{ openapi: { url: ./api.yaml }, auth: oauth }`, wants: []want{{"connections.r.auth", "needs openapi.baseUrl"}}},
		{
			name:  "openapi with an Authorization header",
			conn:  `{ openapi: { url: "https://h/openapi.json", headers: { Authorization: "Bearer ${env:CSEC}" } }, auth: oauth }`,
			wants: []want{{"connections.r.auth", "cannot be combined with an Authorization header (openapi.headers.Authorization)"}},
		},
		{name: "source", conn: `{ source: { events: { x: {} } }, auth: oauth }`, wants: []want{{"connections.r.auth", "or an openapi connection"}}},
		{name: "requiresPrincipal not a bool", conn: `{ mcp: { command: x }, requiresPrincipal: sometimes }`, wants: []want{{"connections.r.requiresPrincipal", "true or false"}}},
		{name: "unset env", conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: { clientId: "${env:NOPE}" } } }`, wants: []want{{"connections.r.auth.oauth.clientId", "NOPE is not set"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := env{"PATCHBAY_CONFIG": "f", "CID": "cid-1", "CSEC": "sekrit-1"}
			c, err := load(e, files{"f": "connections:\n  r: " + tt.conn + "\n"})
			checkProblems(t, err, tt.wants...)
			if err != nil && strings.Contains(err.Error(), "sekrit-1") {
				t.Errorf("error quotes a secret:\n%v", err)
			}
			if err == nil && tt.check != nil {
				tt.check(t, c.File.Connections["r"])
			}
		})
	}
}

func TestLoadLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		env   env
		check func(t *testing.T, l config.Limits)
		wants []want
	}{
		{
			name: "defaults",
			env:  env{},
			check: func(t *testing.T, l config.Limits) {
				want := config.Limits{
					ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute,
					IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10, MaxConns: 1024, MaxConnsPerAddress: 256,
					AuthFailures: 5, AuthBackoff: time.Second, AuthBackoffMax: 5 * time.Minute,
					MaxStreams: 512, MaxStreamsPerPrincipal: 32,
					QuestionHold: 5 * time.Minute, MCPHold: 30 * time.Second, MCPSessionsPerPrincipal: 64, MCPCallsPerPrincipal: 16, MCPSessionIdle: 30 * time.Minute,
				}
				if !reflect.DeepEqual(l, want) {
					t.Errorf("limits = %+v, want %+v", l, want)
				}
			},
		},
		{
			name: "all set",
			env: env{
				"PATCHBAY_READ_HEADER_TIMEOUT": "1s", "PATCHBAY_READ_TIMEOUT": "2s", "PATCHBAY_WRITE_TIMEOUT": "3s",
				"PATCHBAY_IDLE_TIMEOUT": "4s", "PATCHBAY_MAX_HEADER_BYTES": "8192", "PATCHBAY_MAX_CONNS": "7",
				"PATCHBAY_MAX_CONNS_PER_ADDRESS": "3",
				"PATCHBAY_AUTH_FAILURES":         "2", "PATCHBAY_AUTH_BACKOFF": "100ms", "PATCHBAY_AUTH_BACKOFF_MAX": "1m",
				"PATCHBAY_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.7 ,fd00::/8,::ffff:198.51.100.1,",
				"PATCHBAY_MAX_STREAMS":     "9", "PATCHBAY_MAX_STREAMS_PER_PRINCIPAL": "9",
				"PATCHBAY_MCP_HOLD": "2s", "PATCHBAY_QUESTION_HOLD": "90s", "PATCHBAY_MCP_SESSIONS_PER_PRINCIPAL": "3", "PATCHBAY_MCP_CALLS_PER_PRINCIPAL": "4",
				"PATCHBAY_MCP_SESSION_IDLE": "5m",
			},
			check: func(t *testing.T, l config.Limits) {
				want := config.Limits{
					ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second,
					IdleTimeout: 4 * time.Second, MaxHeaderBytes: 8192, MaxConns: 7, MaxConnsPerAddress: 3,
					AuthFailures: 2, AuthBackoff: 100 * time.Millisecond, AuthBackoffMax: time.Minute,
					MaxStreams: 9, MaxStreamsPerPrincipal: 9,
					QuestionHold: 90 * time.Second, MCPHold: 2 * time.Second, MCPSessionsPerPrincipal: 3, MCPCallsPerPrincipal: 4, MCPSessionIdle: 5 * time.Minute,
					TrustedProxies: []netip.Prefix{
						netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
						netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("198.51.100.1/32"),
					},
				}
				if !reflect.DeepEqual(l, want) {
					t.Errorf("limits = %+v, want %+v", l, want)
				}
			},
		},
		{
			name: "unparsable",
			env: env{
				"PATCHBAY_READ_TIMEOUT": "60", "PATCHBAY_MAX_CONNS": "many", "PATCHBAY_TRUSTED_PROXIES": "10.0.0.0/8,proxy.local",
				"PATCHBAY_MAX_STREAMS": "lots",
			},
			wants: []want{
				{"PATCHBAY_MAX_CONNS", "whole number"}, {"PATCHBAY_MAX_STREAMS", "whole number"}, {"PATCHBAY_READ_TIMEOUT", "duration"},
				{"PATCHBAY_TRUSTED_PROXIES[1]", "CIDR"},
			},
		},
		{
			name: "out of range",
			env: env{
				"PATCHBAY_READ_HEADER_TIMEOUT": "2m", "PATCHBAY_WRITE_TIMEOUT": "0s", "PATCHBAY_MAX_HEADER_BYTES": "100",
				"PATCHBAY_MAX_CONNS": "0", "PATCHBAY_AUTH_FAILURES": "1001", "PATCHBAY_AUTH_BACKOFF": "1m",
				"PATCHBAY_AUTH_BACKOFF_MAX": "30s", "PATCHBAY_MAX_CONNS_PER_ADDRESS": "0",
			},
			wants: []want{
				{"PATCHBAY_AUTH_BACKOFF_MAX", "not be shorter than PATCHBAY_AUTH_BACKOFF"},
				{"PATCHBAY_AUTH_FAILURES", "between 1 and 1000"},
				{"PATCHBAY_MAX_CONNS", "not 0"},
				{"PATCHBAY_MAX_CONNS_PER_ADDRESS", "not 0"},
				{"PATCHBAY_MAX_HEADER_BYTES", "4 KiB"},
				{"PATCHBAY_READ_HEADER_TIMEOUT", "not be longer than PATCHBAY_READ_TIMEOUT"},
				{"PATCHBAY_WRITE_TIMEOUT", "from 10ms to 24h"},
			},
		},
		{
			name: "stream caps out of range",
			env:  env{"PATCHBAY_MAX_STREAMS": "0"},
			wants: []want{
				{"PATCHBAY_MAX_STREAMS", "not 0"},
			},
		},
		{
			name: "more streams per principal than in all",
			env:  env{"PATCHBAY_MAX_STREAMS": "10", "PATCHBAY_MAX_STREAMS_PER_PRINCIPAL": "11"},
			wants: []want{
				{"PATCHBAY_MAX_STREAMS_PER_PRINCIPAL", "between 1 and PATCHBAY_MAX_STREAMS (10), not 11"},
			},
		},
		{
			name:  "no streams per principal",
			env:   env{"PATCHBAY_MAX_STREAMS_PER_PRINCIPAL": "0"},
			wants: []want{{"PATCHBAY_MAX_STREAMS_PER_PRINCIPAL", "not 0"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := load(tt.env, nil)
			checkProblems(t, err, tt.wants...)
			if tt.check != nil && c != nil {
				tt.check(t, c.Limits)
			}
		})
	}
}
