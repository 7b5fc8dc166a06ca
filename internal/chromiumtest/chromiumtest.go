// Package chromiumtest starts Debian's headless chromium for browser tests
// (the admin UI's, the OAuth sign-in's) with the flags this project's CI
// machines need. Under CI=true a missing chromium fails the test;
// elsewhere the test skips.
package chromiumtest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path is the chromium binary, or the test fails (CI) or skips.
func Path(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true requires chromium for the browser tests (apt-get install -y chromium)")
		}
		t.Skip("chromium is not installed (set CI=true to make this fail)")
	}
	return path
}

// Context starts a headless chromium, 1280×900, and returns a chromedp
// context that ends after 90 s or at cleanup.
func Context(t testing.TB) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(Path(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1280, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}
