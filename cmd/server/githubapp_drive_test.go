package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/drive/drivetest"
)

// TestAgentReadsDriveOpensGitHubIssue runs Drive and GitHub end to end: a model
// turn (a fake model server) reads a Drive file through a service-account
// Drive connection and opens a GitHub issue through an OpenAPI connection
// authenticated by the App source, for alice's org. No token — Google's,
// GitHub's — and no key appears in what the model was sent, the record,
// its events or the log.
func TestAgentReadsDriveOpensGitHubIssue(t *testing.T) {
	t.Parallel()
	fake := drivetest.New(t, map[string]string{"tok-robot": "robot"})
	account := drivetest.NewAccount(t, fake, "tok-robot", drive.DefaultScope, "")
	shared := fake.Add("tok-robot", "Shared with the robot", drive.FolderMIME, "root", "")
	reports := fake.Add("tok-robot", "Reports", drive.FolderMIME, shared, "")
	fake.Add("tok-robot", "bug.txt", "text/plain", reports, "The nightly build fails on arm64.")

	api := newIssuesAPI(t)
	gh := api.gh
	gh.Install("acme", "widgets", 1)
	gh.Install("alice-org", "widgets", 2)
	llm := newScriptedCalls(t, []scriptedCall{
		{Tool: "robot_read_file", Args: `{"path": "Reports/bug.txt"}`},
		{Tool: "gh_issues_create", Args: `{"owner": "alice-org", "repo": "widgets", "title": "Nightly build fails on arm64", "body": "From Reports/bug.txt"}`},
	}, "Opened alice-org/widgets#1.")
	cfg := strings.NewReplacer(
		"apiKeys:\n", fmt.Sprintf(`  robot:
    drive: { rootFolderId: %s, apiBaseUrl: %q, uploadBaseUrl: %q }
    auth: { serviceAccount: { key: "${secret:drive.key}" } }
apiKeys:
`, shared, fake.APIURL(), fake.UploadURL()),
		`      gh: { ops: ["*"] }`, `      gh: { ops: ["*"] }
      robot: { ops: ["*"] }`,
	).Replace(mustRead(t, gitHubAppConfig(t, gh)))
	cfg = writeConfig(t, cfg+fmt.Sprintf("models:\n  local: { type: openai, baseURL: %q }\n", llm.URL+"/v1"))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg,
		"PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM(), "PATCHBAY_SECRET_DRIVE_KEY": account.Key(),
	})
	status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k-alice", []byte(`{"agent":{"model":"local/llama3",
		"instructions":"Read Reports/bug.txt and open an issue about it.","tools":[{"connection":"robot"},{"connection":"gh"}]},"input":"go"}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	ex = waitDoneAs(t, srv.url, "k-alice", ex["id"].(string))
	if ex["status"] != "succeeded" || ex["output"] != "Opened alice-org/widgets#1." {
		t.Fatalf("execution = %v", ex)
	}
	if calls := api.called(); len(calls) != 1 || calls[0].Owner != "alice-org" {
		t.Fatalf("GitHub calls carried %+v", calls)
	}
	llm.mu.Lock()
	results := strings.Join(llm.results, "\n")
	llm.mu.Unlock()
	if !strings.Contains(results, "fails on arm64") || !strings.Contains(results, "Nightly build fails on arm64") {
		t.Fatalf("tool results sent to the model: %q", results)
	}
	leaks := append(append(gh.Tokens(), account.Issued()...), "PRIVATE KEY")
	if len(gh.Tokens()) == 0 || len(account.Issued()) == 0 {
		t.Fatal("no token was minted")
	}
	for _, tok := range leaks {
		if strings.Contains(results, tok) || strings.Contains(srv.output.String(), tok) {
			t.Fatalf("%q reached the model or the log", tok)
		}
	}
	checkNoSecretAs(t, srv.url, "k-alice", ex["id"].(string), leaks...)
}
