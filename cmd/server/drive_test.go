package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/drive/drivetest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// TestDriveConnection runs Google Drive connections end to end through
// POST /v1/executions, against the local fakes of Drive, Google's token
// endpoint and Google's authorization server: one acting as a service
// account (a JSON key held as a secret), one per user through the OAuth
// sign-in (alice and bob each sign in to the admin UI with their API key
// and connect their own Google account). Every call carries the right
// token, and no token, key or client secret appears in an execution, its
// events or the log.
func TestDriveConnection(t *testing.T) {
	t.Parallel()
	fake := drivetest.New(t, map[string]string{"tok-robot": "robot", "ya29.alice-secret": "alice", "ya29.bob-secret": "bob"})
	account := drivetest.NewAccount(t, fake, "tok-robot", drive.DefaultScope, "")
	google := drivetest.NewSignIn(t, fake)
	shared := fake.Add("tok-robot", "Shared with the robot", drive.FolderMIME, "root", "")
	fake.Add("ya29.alice-secret", "me.txt", "text/plain", "root", "alice's file")
	fake.Add("ya29.bob-secret", "me.txt", "text/plain", "root", "bob's file")

	llm := newScriptedLLM(t, "robot_read_file", `{"path": "Reports/q1.txt"}`, "Revenue was 42.")
	const aliceKey, bobKey = "drive-alice-key-0123", "drive-bob-key-0123"
	addr := freeAddr(t)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  robot:
    drive: { rootFolderId: %[3]s, apiBaseUrl: %[1]q, uploadBaseUrl: %[2]q }
    auth: { serviceAccount: { key: "${secret:drive.key}" } }
  mine:
    drive: { apiBaseUrl: %[1]q, uploadBaseUrl: %[2]q }
    auth:
      oauth: { issuer: %[4]q, clientId: %[5]q, clientSecret: "${env:GOOGLE_CLIENT_SECRET}" }
      perUser: true
allowlists:
  default: { connections: { robot: { ops: ["*"] }, mine: { ops: ["*"] } } }
apiKeys:
  - { name: alice, key: %[6]s, allowlist: default }
  - { name: bob, key: %[7]s, allowlist: default }
models:
  local: { type: openai, baseURL: %[8]q }
`, fake.APIURL(), fake.UploadURL(), shared, google.Issuer(), google.ClientID, aliceKey, bobKey, llm.URL+"/v1"))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": addr, "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_SECRET_DRIVE_KEY": account.Key(), "GOOGLE_CLIENT_SECRET": google.ClientSecret,
	})
	var secrets []string
	leaks := func() []string {
		out := append([]string{google.ClientSecret, "PRIVATE KEY", "1//refresh-", "ya29."}, secrets...)
		return append(out, account.Issued()...)
	}

	t.Run("status", func(t *testing.T) {
		var robot, mine struct {
			Kind   string         `json:"kind"`
			URL    string         `json:"url"`
			State  string         `json:"state"`
			Tools  []string       `json:"tools"`
			SignIn string         `json:"signIn"`
			Info   map[string]any `json:"info"`
		}
		getJSON(t, srv.url+"/v1/connections/robot", &robot)
		want := "robot_list_files robot_find_file robot_read_file robot_create_file robot_update_file robot_save_file robot_create_folder robot_delete_file"
		if robot.Kind != "drive" || robot.State != "ready" || strings.Join(robot.Tools, " ") != want || robot.URL != fake.APIURL() ||
			robot.Info["auth"] != "serviceAccount" || robot.Info["rootFolderId"] != shared {
			t.Fatalf("robot = %+v", robot)
		}
		getJSON(t, srv.url+"/v1/connections/mine", &mine)
		if mine.Kind != "drive" || mine.State != "ready" || mine.SignIn != "per-user" || len(mine.Tools) != 8 {
			t.Fatalf("mine = %+v", mine)
		}
	})

	t.Run("service account", func(t *testing.T) {
		ex := post(t, srv.url, "k1", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"robot":{}},
			"root":{"kind":"sequence","id":"main","steps":[
			{"kind":"call","id":"save","connection":"robot","op":"save_file","args":{"path":"Reports/q1.txt","content":"revenue: 42"}},
			{"kind":"call","id":"read","connection":"robot","op":"read_file","args":{"path":"Reports/q1.txt"}}]}}}`))
		out, _ := ex["output"].(map[string]any)
		if ex["status"] != "succeeded" || out["content"] != "revenue: 42" {
			t.Fatalf("execution: %v", ex)
		}
		if account.Exchanges() != 1 {
			t.Fatalf("%d token exchanges", account.Exchanges())
		}
		checkNoSecret(t, srv.url, ex["id"].(string), leaks()...)

		// Gate 2 holds a call to its schema: one of fileId and path.
		before := len(fake.Requests())
		ex = postAny(t, srv.url, "k1", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"robot":{}},
			"root":{"kind":"call","id":"read","connection":"robot","op":"read_file","args":{"fileId":"abc","path":"Reports/q1.txt"}}}}`))
		if e, _ := ex["error"].(map[string]any); ex["status"] != "failed" || e["code"] != "steering_denied" || e["gate"] != 2.0 {
			t.Fatalf("both fileId and path: %v", ex)
		}
		if len(fake.Requests()) != before {
			t.Fatal("a call refused at gate 2 reached Drive")
		}
	})

	t.Run("agent", func(t *testing.T) {
		// A model turn reads the file the service account saved above.
		status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k1",
			[]byte(`{"agent":{"model":"local/llama3","instructions":"Say what the Q1 report says.","tools":[{"connection":"robot"}]},"input":"go"}`))
		if status != http.StatusAccepted {
			t.Fatalf("POST = %d %v", status, ex)
		}
		ex = waitDone(t, srv.url, ex["id"].(string))
		if ex["status"] != "succeeded" || ex["output"] != "Revenue was 42." {
			t.Fatalf("execution = %v", ex)
		}
		llm.mu.Lock()
		offered, result := llm.offered, llm.result
		llm.mu.Unlock()
		if _, ok := offered["robot_read_file"]; !ok || len(offered) != 8 || !strings.Contains(result, "revenue: 42") {
			t.Fatalf("%d tools offered; tool result sent back %q", len(offered), result)
		}
		checkNoSecret(t, srv.url, ex["id"].(string), leaks()...)
	})

	t.Run("per user", func(t *testing.T) {
		read := `{"wait":"10s","workflow":{"version":1,"connections":{"mine":{}},
			"root":{"kind":"call","id":"read","connection":"mine","op":"read_file","args":{"path":"me.txt"}}}}`
		before := len(fake.Requests())
		ex := postAny(t, srv.url, aliceKey, []byte(read))
		e, _ := ex["error"].(map[string]any)
		if ex["status"] != "failed" || e["code"] != "steering_denied" || e["gate"] != 6.0 {
			t.Fatalf("alice before signing in: %v", ex)
		}
		if len(fake.Requests()) != before {
			t.Fatal("a call went to Drive before the sign-in")
		}

		for _, user := range []struct{ key, token string }{{aliceKey, "ya29.alice-secret"}, {bobKey, "ya29.bob-secret"}} {
			google.SignInAs(user.token)
			connectGoogle(t, srv.url, user.key, "mine")
			secrets = append(secrets, user.token)
		}
		if len(fake.Requests()) != before {
			t.Fatal("the sign-in sent requests to Drive (the issuer is configured: nothing to discover there)")
		}
		asked := google.Asked()
		if len(asked) != 2 || asked[0].Get("access_type") != "offline" || asked[0].Get("scope") != drive.DefaultScope {
			t.Fatalf("authorization requests = %v", asked)
		}

		for key, want := range map[string]string{aliceKey: "alice's file", bobKey: "bob's file"} {
			ex := post(t, srv.url, key, []byte(read))
			if out, _ := ex["output"].(map[string]any); ex["status"] != "succeeded" || out["content"] != want {
				t.Fatalf("execution with %s: %v", key, ex)
			}
			checkNoSecretAs(t, srv.url, key, ex["id"].(string), leaks()...)
		}
		for _, r := range fake.Requests()[before:] {
			if r.Owner != "alice" && r.Owner != "bob" || r.Auth != "Bearer ya29."+r.Owner+"-secret" {
				t.Fatalf("a per-user call carried %+v", r)
			}
		}

		// Drive refuses alice's token before it expires: patchbay
		// refreshes it once and sends the call again with the new one.
		fake.Revoke("ya29.alice-secret")
		secrets = append(secrets, "ya29.alice-secret-r1")
		ex = post(t, srv.url, aliceKey, []byte(read))
		if out, _ := ex["output"].(map[string]any); ex["status"] != "succeeded" || out["content"] != "alice's file" {
			t.Fatalf("execution after a refused token: %v\n%s", ex, srv.output)
		}
		if n := google.Refreshes("ya29.alice-secret"); n != 1 {
			t.Fatalf("%d refreshes, want 1", n)
		}
		last := fake.Requests()[len(fake.Requests())-1]
		if last.Auth != "Bearer ya29.alice-secret-r1" {
			t.Fatalf("the call after the refresh carried %q", last.Auth)
		}
		checkNoSecretAs(t, srv.url, aliceKey, ex["id"].(string), leaks()...)
	})

	if out := srv.output.String(); containsAny(out, leaks()) != "" {
		t.Fatalf("the log shows %q:\n%s", containsAny(out, leaks()), out)
	}
}

func containsAny(s string, subs []string) string {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return sub
		}
	}
	return ""
}

var csrfInput = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// connectGoogle does in a plain HTTP client what a browser does: sign in
// to the admin UI with an API key, open /oauth/{conn}/start and follow the
// redirects through the authorization server back to the callback.
func connectGoogle(t *testing.T, base, apiKey, conn string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.Get(base + "/admin/sign-in")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfInput.FindSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the sign-in page:\n%s", page)
	}
	resp, err = c.PostForm(base+"/admin/sign-in", url.Values{"_csrf": {string(m[1])}, "token": {apiKey}, "next": {"/admin/connections/" + conn}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = c.Get(base + "/oauth/" + conn + "/start")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(resp.Request.URL.Path, "/admin/connections/"+conn) || resp.Request.URL.Query().Get("flash") != "signed-in" {
		t.Fatalf("sign-in ended at %s (%d):\n%s", resp.Request.URL, resp.StatusCode, body)
	}
}

// TestDriveAccess: a drive entry signed in per user acts as a user, so
// executions without a principal never see its tools; a service account
// acts as itself unless the entry says requiresPrincipal.
func TestDriveAccess(t *testing.T) {
	t.Parallel()
	perUser := config.Connection{Drive: &config.Drive{}, Auth: &config.Auth{OAuth: &config.OAuth{}, PerUser: true}}
	robot := config.Connection{Drive: &config.Drive{}, Auth: &config.Auth{ServiceAccount: &config.ServiceAccount{Key: "${secret:k}"}}}
	if a := access(perUser); !a.ActsAsUser() || !a.RequiresPrincipal || a.SignIn != registry.SignInPerUser {
		t.Fatalf("per-user drive access = %+v", a)
	}
	if a := access(robot); a.ActsAsUser() || a.SignIn != "" {
		t.Fatalf("service account drive access = %+v", a)
	}
	robot.RequiresPrincipal = true
	if a := access(robot); !a.ActsAsUser() {
		t.Fatalf("service account with requiresPrincipal = %+v", a)
	}
}
