// Command demo-mcp is a small MCP server for trying patchbay and for its
// tests. It serves the tools of internal/demo (echo, add, note_put, note_get,
// fail, slow_job, open_ticket) over stdio by default, or over Streamable HTTP
// at /mcp with -http ADDR. Over HTTP, slow_job runs as a task of the MCP
// Tasks extension
// for a client that declares it (patchbay does); elsewhere it blocks. Over
// HTTP it also offers the event ticket.created (MCP Events, push and poll
// delivery), raised by open_ticket, and ticket.escalated (webhook delivery),
// raised by open_ticket with priority high. With -profile chat it also declares profile chat@1
// and serves chat.post, chat.reply and the read chat.thread.recent. It stops
// cleanly on SIGINT or SIGTERM, and in stdio mode also
// when its input is closed.
//
//	demo-mcp                      # stdio, as a patchbay connection command
//	demo-mcp -profile chat        # also speaks chat@1
//	demo-mcp -http 127.0.0.1:0    # prints "demo-mcp listening on http://127.0.0.1:PORT/mcp"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/demo"
)

// shutdownTimeout bounds how long in-flight HTTP requests may take to finish
// after a signal.
const shutdownTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo-mcp:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends (or, on stdio, until stdin is closed). Stdio mode
// uses the process's stdin and stdout, which are the protocol stream;
// everything else goes to stderr.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo-mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http", "", "serve Streamable HTTP at http://`ADDR`/mcp instead of stdio (port 0 picks a free port)")
	profile := fs.String("profile", "", "also speak `PROFILE`: chat declares chat@1 and serves chat.post, chat.reply and the read chat.thread.recent")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	var opts []server.ServerOption
	if *httpAddr != "" {
		opts = append(opts, demo.EventsCapability()) // events are served over HTTP only
	}
	var srv *server.MCPServer
	switch *profile {
	case "":
		srv = demo.NewServer(opts...)
	case "chat":
		srv = demo.NewChatServer(opts...)
	default:
		return fmt.Errorf("-profile %q: the demo speaks only chat", *profile)
	}
	jobs, events := demo.NewJobs(), demo.NewEvents()
	events.Push, events.Hooks = true, demo.NewHooks()
	srv.AddTools(jobs.Tool(), events.Tool())
	if *httpAddr == "" {
		return serveStdio(ctx, srv, stderr)
	}
	extensions := func(h http.Handler) http.Handler { return jobs.Handler(events.Handler(h)) }
	return serveHTTP(ctx, srv, extensions, *httpAddr, stderr)
}

func serveStdio(ctx context.Context, srv *server.MCPServer, stderr io.Writer) error {
	s := server.NewStdioServer(srv)
	s.SetErrorLogger(log.New(stderr, "demo-mcp: ", log.LstdFlags))
	err := s.Listen(ctx, os.Stdin, os.Stdout)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // a signal is a normal way to stop
	}
	return err
}

// serveHTTP serves srv behind the handlers of extensions, which answer
// the extension requests mcp-go does not serve (tasks, events) and hand
// the rest on to it.
func serveHTTP(ctx context.Context, srv *server.MCPServer, extensions func(http.Handler) http.Handler, addr string, stderr io.Writer) error {
	// Listen before announcing, so the printed address is the real one (port
	// 0) and a client reading it can connect at once.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	mcpHandler := server.NewStreamableHTTPServer(srv, server.WithStreamableHTTPLogger(logger))
	mux := http.NewServeMux()
	mux.Handle("/mcp", extensions(mcpHandler))
	hs := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	fmt.Fprintf(stderr, "demo-mcp listening on http://%s/mcp\n", ln.Addr())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	// Ending the MCP sessions first releases long-lived GET streams, which
	// http.Server.Shutdown would otherwise wait on.
	err = errors.Join(mcpHandler.Shutdown(sctx), hs.Shutdown(sctx))
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}
