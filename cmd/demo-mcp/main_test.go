package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
)

func TestRunHTTP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"-http", "127.0.0.1:0"}, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	lines := bufio.NewScanner(pr)
	if !lines.Scan() {
		t.Fatalf("run printed nothing: %v", lines.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url, ok := strings.CutPrefix(lines.Text(), "demo-mcp listening on ")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") || strings.HasPrefix(url, "http://127.0.0.1:0/") || !strings.HasSuffix(url, "/mcp") {
		t.Fatalf("run printed %q", lines.Text())
	}

	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ClientInfo: mcp.Implementation{Name: "test"}}}); err != nil {
		t.Fatal(err)
	}
	tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil || len(tools.Tools) != 6 {
		t.Fatalf("ListTools: %v, %v", tools, err)
	}
	var call mcp.CallToolRequest
	call.Params.Name = "add"
	call.Params.Arguments = map[string]any{"a": 1, "b": 2}
	res, err := c.CallTool(ctx, call)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(res.StructuredContent); string(got) != `{"sum":3}` {
		t.Errorf("add: structuredContent %s", got)
	}

	cancel() // what a signal does in main
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func TestRunArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr string
		wantOut string
	}{
		{"help", []string{"-h"}, "", "-http ADDR"},
		{"unknown flag", []string{"-nope"}, "flag provided but not defined", ""},
		{"extra argument", []string{"serve"}, `unexpected arguments ["serve"]`, ""},
		{"bad address", []string{"-http", "127.0.0.1:notaport"}, "notaport", ""},
		{"unknown profile", []string{"-profile", "fax"}, `-profile "fax": the demo speaks only chat`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			err := run(t.Context(), tt.args, &out)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("err = %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("output %q, want %q in it", out.String(), tt.wantOut)
			}
		})
	}
}
