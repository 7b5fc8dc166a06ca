// Command mcp-conformance is the client under test for the official MCP
// conformance suite (@modelcontextprotocol/conformance). It is built on
// internal/mcp, so the suite measures patchbay's own provider.
//
// The suite runs it as `mcp-conformance <server-url>`, with the scenario in
// MCP_CONFORMANCE_SCENARIO, the protocol revision in
// MCP_CONFORMANCE_PROTOCOL_VERSION and any scenario context (JSON) in
// MCP_CONFORMANCE_CONTEXT. It connects the way a patchbay connection does
// (discovery or handshake, tools read to the end), then calls every tool
// with arguments made from its input schema, and exits non-zero when the
// connection fails.
//
// For the auth/* scenarios it signs in with internal/oauth whenever the
// server asks (a 401, or a 403 insufficient_scope), headless: it follows
// the authorization server's redirects itself to a loopback callback that
// completes the sign-in, then sends the request again; at most three
// sign-ins per run. Pre-registered credentials come from
// MCP_CONFORMANCE_CONTEXT (client_id, client_secret, issuer), and the
// suite's Client ID Metadata Document URL is used where the authorization
// server accepts one.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-conformance:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: mcp-conformance <server-url>")
	}
	url := args[len(args)-1]
	scenario := getenv("MCP_CONFORMANCE_SCENARIO")
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	logger.Info("conformance client", "scenario", scenario, "protocolVersion", getenv("MCP_CONFORMANCE_PROTOCOL_VERSION"), "url", url)

	opts := &pbmcp.Options{
		Logger:          logger,
		ClientVersion:   "conformance",
		ProtocolVersion: getenv("MCP_CONFORMANCE_PROTOCOL_VERSION"),
	}
	if strings.HasPrefix(scenario, "elicitation") || strings.HasPrefix(scenario, "sep-2322") {
		// patchbay itself never elicits; these scenarios test a client that
		// does, so this one answers with the schema's defaults.
		opts.Elicitation = defaultsElicitation{}
		opts.ElicitationCapability = &mcp.ElicitationCapability{}
	}
	var sc struct {
		authContext
		ToolCalls []struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"toolCalls"`
	}
	if raw := getenv("MCP_CONFORMANCE_CONTEXT"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &sc); err != nil {
			return fmt.Errorf("MCP_CONFORMANCE_CONTEXT: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if strings.HasPrefix(scenario, "auth/") {
		// Sign in with internal/oauth whenever the server asks.
		s, err := newSigner(ctx, url, sc.authContext, logger)
		if err != nil {
			return err
		}
		defer s.Close()
		opts.HTTPClient = &http.Client{Transport: s}
	}
	conn, err := pbmcp.New("conformance", config.MCP{URL: url, RequestTimeoutMs: 20_000}, opts).Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Fprintf(stdout, "connected: %v\n", conn.Info())

	type call struct {
		op   string
		args map[string]any
	}
	var calls []call
	for _, c := range sc.ToolCalls {
		calls = append(calls, call{c.Name, c.Arguments})
	}
	if len(calls) == 0 {
		ops := conn.Manifest().Operations
		for _, op := range ops {
			args := argsFor(op.InputSchema)
			if _, echo := args["schema"]; echo && len(ops) == 2 {
				// A tool that asks for "the inputSchema the client observed"
				// of the other tool gets it verbatim, to show nothing was
				// lost in parsing.
				for _, other := range ops {
					if other.Name != op.Name {
						args["schema"] = json.RawMessage(other.InputSchema)
					}
				}
			}
			calls = append(calls, call{op.Name, args})
		}
	}
	for _, c := range calls {
		op := connect.Operation{Name: c.op}
		v, err := conn.Call(ctx, connect.CallRequest{Op: c.op, Args: c.args})
		var callErr *connect.CallError
		switch {
		case errors.As(err, &callErr):
			fmt.Fprintf(stdout, "tool %s: error result: %s\n", op.Name, callErr.Message)
		case err != nil:
			fmt.Fprintf(stdout, "tool %s: %v\n", op.Name, err)
		default:
			b, _ := json.Marshal(v)
			fmt.Fprintf(stdout, "tool %s: %s\n", op.Name, b)
		}
	}
	return nil
}

// argsFor makes arguments that satisfy simple schemas: every required
// property gets its default, first example or enum value, or a value of its
// type; optional ones are left out.
func argsFor(raw json.RawMessage) map[string]any {
	var s struct {
		Properties map[string]map[string]any `json:"properties"`
		Required   []string                  `json:"required"`
	}
	_ = json.Unmarshal(raw, &s)
	args := map[string]any{}
	for _, name := range s.Required {
		args[name] = valueFor(s.Properties[name])
	}
	return args
}

func valueFor(p map[string]any) any {
	if d, ok := p["default"]; ok {
		return d
	}
	if ex, ok := p["examples"].([]any); ok && len(ex) > 0 {
		return ex[0]
	}
	if enum, ok := p["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	if c, ok := p["const"]; ok {
		return c
	}
	switch p["type"] {
	case "number", "integer":
		return 1
	case "boolean":
		return true
	case "object":
		return map[string]any{}
	case "array":
		return []any{}
	default:
		return "test"
	}
}

// defaultsElicitation accepts every elicitation with the defaults its
// requested schema declares.
type defaultsElicitation struct{}

func (defaultsElicitation) Elicit(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	content := map[string]any{}
	b, _ := json.Marshal(req.Params.RequestedSchema)
	var s struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	_ = json.Unmarshal(b, &s)
	for name, p := range s.Properties {
		if d, ok := p["default"]; ok {
			content[name] = d
		}
	}
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept, Content: content}}, nil
}
