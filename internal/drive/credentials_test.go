package drive_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/drive/drivetest"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// TestServiceAccountRefusalSaysWhy: a token endpoint that refuses the
// key has its code and description in the call's error, whatever body
// x/oauth2 kept (x/oauth2/jwt keeps nothing else), and an assertion it
// echoes is cut out.
func TestServiceAccountRefusalSaysWhy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, contentType, body, want string
	}{
		{"google", "application/json", `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`,
			"drive rogue: list_files: service account token: invalid_grant: Invalid JWT Signature."},
		{"json as text", "text/plain", `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`,
			"drive rogue: list_files: service account token: invalid_grant: Invalid JWT Signature."},
		{"echoed assertion", "application/json", `{"error":"invalid_grant","error_description":"Invalid JWT: {assertion}"}`,
			"drive rogue: list_files: service account token: invalid_grant: Invalid JWT: <redacted>"},
		{"html", "text/html", `<html><body>oops</body></html>`,
			"drive rogue: list_files: service account token: HTTP 502 Bad Gateway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := drivetest.New(t, nil)
			account := drivetest.NewAccount(t, fake, "tok-robot", drive.DefaultScope, "")
			status := http.StatusBadRequest
			if tt.name == "html" {
				status = http.StatusBadGateway
			}
			account.Refuse(status, tt.contentType, tt.body)
			sa := config.ServiceAccount{Key: "${secret:DRIVE_KEY}"}
			p := drive.New("rogue", config.Drive{APIBaseURL: fake.APIURL(), UploadBaseURL: fake.UploadURL()},
				&drive.Options{ServiceAccount: &sa, Secrets: &memSecrets{m: map[string]string{"DRIVE_KEY": account.Key()}}})
			c, err := p.Connect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Call(context.Background(), connect.CallRequest{Op: "list_files", Args: map[string]any{}})
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "eyJ") {
				t.Fatalf("the error quotes the assertion: %v", err)
			}
			if n := len(fake.Requests()); n != 0 {
				t.Fatalf("%d requests reached Drive", n)
			}
		})
	}
}

// TestRedirectsKeepTheToken: Drive answering with a redirect to another
// port of its host does not get the caller's token or the service
// account's sent there; with followRedirects: any the request goes
// without it.
func TestRedirectsKeepTheToken(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"files":[]}`))
	}))
	t.Cleanup(other.Close)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/elsewhere", http.StatusFound)
	}))
	t.Cleanup(api.Close)
	fake := drivetest.New(t, nil)
	account := drivetest.NewAccount(t, fake, "tok-robot", drive.DefaultScope, "")
	secrets := &memSecrets{m: map[string]string{"DRIVE_KEY": account.Key()}}
	for _, tt := range []struct {
		name, follow string
		sa           bool
		wantSeen     string
	}{
		{name: "caller's token", follow: ""},
		{name: "service account's token", sa: true},
		{name: "caller's token, any origin", follow: "any", wantSeen: "/elsewhere auth="},
		{name: "service account's token, any origin", follow: "any", sa: true, wantSeen: "/elsewhere auth="},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		opts := &drive.Options{}
		req := connect.CallRequest{Op: "list_files", Args: map[string]any{}, Headers: map[string]string{"Authorization": "Bearer tok-alice"}}
		if tt.sa {
			opts = &drive.Options{ServiceAccount: &config.ServiceAccount{Key: "${secret:DRIVE_KEY}"}, Secrets: secrets}
			req.Headers = nil
		}
		c, err := drive.New("gdrive", config.Drive{APIBaseURL: api.URL + "/drive/v3", UploadBaseURL: api.URL + "/upload", FollowRedirects: tt.follow}, opts).Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Call(context.Background(), req)
		var ce *connect.CallError
		if tt.wantSeen == "" && (!errors.As(err, &ce) || !strings.Contains(ce.Message, "not followed")) {
			t.Errorf("%s: err = %v, want the redirect refused", tt.name, err)
		}
		if tt.wantSeen != "" && err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		mu.Lock()
		if got := strings.Join(seen, "; "); got != tt.wantSeen {
			t.Errorf("%s: the other port saw %q, want %q", tt.name, got, tt.wantSeen)
		}
		mu.Unlock()
	}
}
