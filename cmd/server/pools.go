package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// poolProvider is the provider of a pooled mcp connection: each lease gets
// a new server from spec, with ${setup.FIELD} in its args, env, url and
// headers replaced by the lease's setup value.
func poolProvider(st *store.Store, name string, spec config.Connection, reclaimAfter time.Duration, logger *slog.Logger, redactor *secrets.SecretRedactor) (connect.Provider, error) {
	pool, err := pools.New(st, name, spec.Pool.Max, &pools.Options{ReclaimAfter: reclaimAfter})
	if err != nil {
		return nil, err
	}
	var schema map[string]any
	var hostOnly []string
	if s := spec.Pool.Setup; s != nil {
		schema, hostOnly = s.Schema, s.HostOnly
	}
	redactor.Add(mcp.Secrets(*spec.MCP)...)
	return pools.NewProvider(pool, pools.ProviderOptions{
		Wait: spec.Pool.Wait(), Schema: schema, HostOnly: hostOnly, Logger: logger,
		Provision: func(ctx context.Context, setup map[string]any) (connect.Conn, error) {
			return mcp.New(name, withSetup(*spec.MCP, setup), &mcp.Options{Logger: logger}).Connect(ctx)
		},
	})
}

var setupRef = regexp.MustCompile(`\$\{setup\.([A-Za-z0-9_-]+)\}`)

// withSetup returns a copy of m with ${setup.FIELD} replaced in the fields
// a document's setup may reach: args, env, url and header values (never
// the command). A missing field is the empty string; a value that is not
// a string is written as JSON. Each arg stays one argument: no shell.
func withSetup(m config.MCP, setup map[string]any) config.MCP {
	sub := func(s string) string {
		return setupRef.ReplaceAllStringFunc(s, func(ref string) string {
			v, ok := setup[setupRef.FindStringSubmatch(ref)[1]]
			if !ok || v == nil {
				return ""
			}
			if s, ok := v.(string); ok {
				return s
			}
			data, _ := json.Marshal(v)
			return string(data)
		})
	}
	m.Args = slices.Clone(m.Args)
	for i := range m.Args {
		m.Args[i] = sub(m.Args[i])
	}
	m.Env, m.Headers = maps.Clone(m.Env), maps.Clone(m.Headers)
	for k := range m.Env {
		m.Env[k] = sub(m.Env[k])
	}
	for k := range m.Headers {
		m.Headers[k] = sub(m.Headers[k])
	}
	m.URL = sub(m.URL)
	return m
}
