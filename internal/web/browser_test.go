package web_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/patchbay-dev/patchbay/internal/chromiumtest"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// screenshots is where the browser tests leave a picture of each page
// (gitignored; `make screenshots` copies the docs' pictures from here to
// docs/img, as docs/img/SOURCES lists them).
var screenshots = filepath.Join("..", "..", "artifacts", "screenshots")

// shipDoc is guardedDoc with a step before the guarded call, so that an
// execution's page (a picture in the docs) shows a ledger of two steps.
const shipDoc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
 {"kind":"call","id":"check","connection":"mem","op":"echo","args":{"text":"release v1.4.2"}},
 {"kind":"call","id":"ship","connection":"mem","op":"guarded","args":{"target":"prod","ticket":42}}]}}`

// browser starts Debian's headless chromium (see chromiumtest).
func browser(t *testing.T) context.Context {
	t.Helper()
	ctx := chromiumtest.Context(t)
	must(t, os.MkdirAll(screenshots, 0o755))
	return ctx
}

// clear empties a form field as a select-all and delete would.
func clear(sel string) chromedp.Action {
	return chromedp.Evaluate(`document.querySelector('`+sel+`').value = ''`, nil)
}

// shot writes a full-page PNG (quality 100; below that chromedp writes JPEG).
func shot(name string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		var buf []byte
		if err := chromedp.FullScreenshot(&buf, 100).Do(ctx); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(screenshots, name+".png"), buf, 0o644)
	})
}

// both takes a page's screenshot at 1280 and at 390 px wide.
func both(name string) chromedp.Action {
	return chromedp.Tasks{
		chromedp.EmulateViewport(1280, 900), shot(name),
		chromedp.EmulateViewport(390, 844), shot(name + "-390"),
		chromedp.EmulateViewport(1280, 900),
	}
}

func TestBrowser(t *testing.T) {
	ctx := browser(t)
	b := setup(t)
	run := func(actions ...chromedp.Action) {
		t.Helper()
		if err := chromedp.Run(ctx, actions...); err != nil {
			t.Fatal(err)
		}
	}
	submit := func() *harness.Execution {
		ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(shipDoc), Principal: "ci-bot", Allowlist: "ops"})
		must(t, err)
		return ex
	}
	finished := func(ex *harness.Execution, want harness.ExecState) {
		t.Helper()
		got, err := b.execs.Wait(context.Background(), ex.ID, 10*time.Second)
		must(t, err)
		if got.Status != want {
			t.Fatalf("execution %s is %s, want %s", ex.ID, got.Status, want)
		}
	}

	// Sign in.
	run(chromedp.Navigate(b.url+"/admin"), chromedp.WaitVisible(`#token`, chromedp.ByQuery), shot("sign-in"),
		chromedp.SendKeys(`#token`, adminToken, chromedp.ByQuery), chromedp.Submit(`#token`, chromedp.ByQuery),
		chromedp.WaitVisible(`#connections`, chromedp.ByQuery))

	// A call that needs approval appears on the open Approvals page without
	// a reload, is approved there, and the execution succeeds on its page.
	run(chromedp.Navigate(b.url+"/admin/approvals"), chromedp.WaitVisible(`#no-pending`, chromedp.ByQuery))
	ex := submit()
	ap := waitPending(t, b)
	card := `#pending article[data-approval="` + ap.ID + `"]`
	run(chromedp.WaitVisible(card, chromedp.ByQuery), both("approvals"),
		chromedp.Navigate(b.url+"/admin/executions/"+ex.ID), chromedp.WaitVisible(`#execution-body[data-status="waiting"]`, chromedp.ByQuery),
		shot("execution-waiting"),
		chromedp.Navigate(b.url+"/admin/approvals"), chromedp.WaitVisible(card, chromedp.ByQuery),
		chromedp.SendKeys(card+` input[name="note"]`, "ship it", chromedp.ByQuery),
		chromedp.Click(card+` button.primary`, chromedp.ByQuery),
		chromedp.WaitVisible(`.flash`, chromedp.ByQuery), chromedp.WaitVisible(`#no-pending`, chromedp.ByQuery),
		chromedp.Navigate(b.url+"/admin/executions/"+ex.ID),
		chromedp.WaitVisible(`#execution-body[data-status="succeeded"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#ledger li[data-step="ship"][data-status="done"]`, chromedp.ByQuery), both("execution"))

	// Live: an execution page open while it waits moves to succeeded when
	// the approval is decided elsewhere.
	ex = submit()
	ap = waitPending(t, b)
	run(chromedp.Navigate(b.url+"/admin/executions/"+ex.ID), chromedp.WaitVisible(`#execution-body[data-status="waiting"]`, chromedp.ByQuery),
		chromedp.Sleep(300*time.Millisecond))
	_, err := b.execs.Approvals().Decide(context.Background(), ap.ID, gates.ApprovalApproved, "other-operator", "")
	must(t, err)
	run(chromedp.WaitVisible(`#execution-body[data-status="succeeded"]`, chromedp.ByQuery))

	// Keyboard only: Tab to the Approve button, press Enter.
	byKeyboard := submit()
	ap = waitPending(t, b)
	card = `#pending article[data-approval="` + ap.ID + `"]`
	run(chromedp.Navigate(b.url+"/admin/approvals"), chromedp.WaitVisible(card, chromedp.ByQuery))
	var focused string
	for range 40 {
		run(chromedp.KeyEvent(kb.Tab),
			chromedp.Evaluate(`(document.activeElement.closest('article')?.dataset.approval || '') + '|' + document.activeElement.textContent.trim()`, &focused))
		if focused == ap.ID+"|Approve" {
			break
		}
	}
	if focused != ap.ID+"|Approve" {
		t.Fatalf("Tab never reached the Approve button (last focus %q)", focused)
	}
	run(chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(`.flash`, chromedp.ByQuery))
	got, err := b.execs.Approvals().Get(context.Background(), ap.ID)
	must(t, err)
	if got.State != gates.ApprovalApproved {
		t.Fatalf("keyboard approval: %s", got.State)
	}
	finished(byKeyboard, harness.ExecSucceeded)

	// An allowlist edit with an invalid glob shows the API's message next
	// to the field; fixing it saves.
	_, perr := gates.ParseAllowlist("ops", []byte(`{"connections":{"mem":{"ops":["ui.["]}}}`))
	want := perr.(*fault.ValidationError).Problems[0].Message
	var msg string
	run(chromedp.Navigate(b.url+"/admin/allowlists/ops"), chromedp.WaitVisible(`#ops-0`, chromedp.ByQuery),
		clear(`#ops-0`), chromedp.SendKeys(`#ops-0`, "ui.[", chromedp.ByQuery),
		chromedp.Click(`#allowlist-form button.primary`, chromedp.ByQuery),
		chromedp.WaitVisible(`#ops-0-err`, chromedp.ByQuery), chromedp.Text(`#ops-0-err .field-error`, &msg, chromedp.ByQuery),
		both("allowlist-error"))
	if strings.TrimSpace(msg) != want {
		t.Fatalf("field error %q, want %q", msg, want)
	}
	run(clear(`#ops-0`), chromedp.SendKeys(`#ops-0`, "echo\nguard*", chromedp.ByQuery),
		chromedp.Click(`#allowlist-form button.primary`, chromedp.ByQuery), chromedp.WaitVisible(`.flash`, chromedp.ByQuery), shot("allowlist"))
	al, err := b.als.Get(context.Background(), "ops")
	must(t, err)
	if strings.Join(al.Connections["mem"].Ops, ",") != "echo,guard*" {
		t.Fatalf("saved ops %v", al.Connections["mem"].Ops)
	}

	// A POST without the CSRF token is refused, even from a signed-in page.
	var status int
	run(chromedp.Evaluate(`fetch('/admin/allowlists/ops/delete', {method: 'POST'}).then(r => r.status)`, &status,
		func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	if status != 403 {
		t.Fatalf("CSRF-less POST: %d", status)
	}
	// The overview (the docs' picture) once there is something to count:
	// the three approved executions succeeded, one more is denied (failed)
	// and one waits for its approval.
	denied := submit()
	ap = waitPending(t, b)
	_, err = b.execs.Approvals().Decide(context.Background(), ap.ID, gates.ApprovalDenied, "other-operator", "not during the freeze")
	must(t, err)
	finished(denied, harness.ExecFailed)
	submit()
	waitPending(t, b)
	run(chromedp.Navigate(b.url+"/admin"), chromedp.WaitVisible(`#exec-counts`, chromedp.ByQuery), both("overview"))
	var counts string
	run(chromedp.Evaluate(`[...document.querySelectorAll('#exec-counts .stat')].map(a => a.dataset.state + '=' + a.querySelector('b').textContent).join(' ')`, &counts))
	if counts != "queued=0 running=0 waiting=1 succeeded=3 failed=1 cancelled=0 approvals=1" {
		t.Fatalf("overview counts %q", counts)
	}

	run(chromedp.Navigate(b.url+"/admin/executions"), chromedp.WaitVisible(`#executions`, chromedp.ByQuery), both("executions"),
		chromedp.Navigate(b.url+"/admin/connections/mem"), chromedp.WaitVisible(`#operations`, chromedp.ByQuery), shot("connection"),
		chromedp.Navigate(b.url+"/admin/deadletters"), chromedp.WaitVisible(`#deadletters`, chromedp.ByQuery), shot("deadletters"))
}
