package web_test

import (
	"net/http"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// The connection page of a Drive connection shows where its calls go,
// its root folder and whom it acts as; other kinds have no Drive panel.
func TestDriveConnectionPage(t *testing.T) {
	t.Parallel()
	b := setupConns(t, nil, func(reg *registry.Registry) {
		sa := &config.ServiceAccount{Key: "${secret:k}"}
		must(t, reg.Add("team", drive.New("team", config.Drive{RootFolderID: "0AbC"}, &drive.Options{ServiceAccount: sa})))
		must(t, reg.SetKind("team", "drive", drive.DefaultAPIBaseURL))
	})
	c := signIn(t, b)
	p := c.get("/admin/connections/team")
	if p.status != http.StatusOK {
		t.Fatalf("team: %d", p.status)
	}
	for sel, want := range map[string]string{
		"#kind":         "drive",
		"#drive-api":    drive.DefaultAPIBaseURL,
		"#drive-upload": drive.DefaultUploadBaseURL,
		"#drive-root":   "0AbC",
		"#drive-auth":   "a service account (its JSON key, held as a secret)",
	} {
		if got := text(p.doc.Find(sel)); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	if n := p.doc.Find("#operations tr[data-op]").Length(); n != 8 {
		t.Errorf("%d operations listed, want 8", n)
	}
	if p = c.get("/admin/connections/mem"); p.doc.Find("#drive").Length() != 0 {
		t.Error("the memory connection shows a Drive panel")
	}
}
