// Command server runs patchbay: the JSON API, the execution workers and the
// configured connections, on Redis or on an embedded in-memory store.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/patchbay-dev/patchbay/internal/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts the shutdown; a second one kills at once.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	if err == nil {
		return
	}
	var ve *config.ValidationError
	if errors.As(err, &ve) {
		fmt.Fprintln(os.Stderr, "patchbay: invalid configuration:")
		for _, p := range ve.Problems {
			fmt.Fprintln(os.Stderr, "  "+p.String())
		}
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "patchbay:", err)
	os.Exit(1)
}
