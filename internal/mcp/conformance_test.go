package mcp_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// conformanceVersion is the @modelcontextprotocol/conformance release the
// client scenarios come from; its requirements/<revision>.yaml files say
// which scenarios each protocol revision requires.
const conformanceVersion = "0.2.0-alpha.12"

// conformanceRevisions are the revisions whose client requirements must
// pass, auth/* scenarios included (cmd/mcp-conformance signs in with
// internal/oauth).
var conformanceRevisions = []string{"2026-07-28", "2025-11-25"}

// unimplementedAuth are not-scored auth extensions patchbay does not
// implement (client credentials, enterprise-managed authorization, DPoP,
// workload identity); they are listed in the log, not run.
var unimplementedAuth = []string{"auth/client-credentials-", "auth/enterprise-managed-authorization", "auth/dpop", "auth/wif-"}

type requirements struct {
	Client    []string `yaml:"client"`
	NotScored []struct {
		Scenario string `yaml:"scenario"`
		Leg      string `yaml:"leg"`
	} `yaml:"not_scored"`
}

var passedRE = regexp.MustCompile(`Passed: (\d+)/(\d+), (\d+) failed`)

// TestConformance runs the official suite's client scenarios against
// cmd/mcp-conformance (built on this package and internal/oauth) for every
// revision: each required scenario, auth/* included, must pass; not-scored
// ones run and are reported, except auth extensions patchbay does not
// implement. `make conformance` prints the counts.
func TestConformance(t *testing.T) {
	t.Parallel()
	suite := npmtest.Require(t, "conformance", "@modelcontextprotocol/conformance@"+conformanceVersion)
	node := npmtest.Node22(t)
	if out, err := exec.Command(node, "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "v22.") {
		t.Fatalf("node 22 at %s: %s %v", node, out, err)
	}
	client := filepath.Join(t.TempDir(), "mcp-conformance")
	if out, err := exec.Command("go", "build", "-o", client, "github.com/patchbay-dev/patchbay/cmd/mcp-conformance").CombinedOutput(); err != nil {
		t.Fatalf("build cmd/mcp-conformance: %v\n%s", err, out)
	}

	for _, rev := range conformanceRevisions {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile(filepath.Join(suite, "requirements", rev+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var req requirements
			if err := yaml.Unmarshal(b, &req); err != nil {
				t.Fatal(err)
			}
			type scenario struct {
				name     string
				required bool
			}
			var scenarios []scenario
			for _, s := range req.Client {
				scenarios = append(scenarios, scenario{s, true})
			}
			var skipped []string
			for _, s := range req.NotScored {
				if s.Leg != "client" {
					continue
				}
				if slices.ContainsFunc(unimplementedAuth, func(p string) bool { return strings.HasPrefix(s.Scenario, p) }) {
					skipped = append(skipped, s.Scenario)
					continue
				}
				scenarios = append(scenarios, scenario{s.Scenario, false})
			}
			var passed, total, checks, checksTotal, authPassed, authTotal int
			var failed []string
			for _, sc := range scenarios {
				ok, p, n, out := runScenario(t, node, suite, client, rev, sc.name)
				status := "pass"
				if !ok {
					status = "FAIL"
				}
				t.Logf("conformance %s %-40s %s (%d/%d checks)%s", rev, sc.name, status, p, n, map[bool]string{true: "", false: " [not scored]"}[sc.required])
				if !sc.required {
					continue
				}
				total++
				checks += p
				checksTotal += n
				isAuth := strings.HasPrefix(sc.name, "auth/")
				if isAuth {
					authTotal++
				}
				if ok {
					passed++
					if isAuth {
						authPassed++
					}
					continue
				}
				failed = append(failed, sc.name)
				t.Errorf("required scenario %s failed at %s:\n%s", sc.name, rev, out)
			}
			t.Logf("conformance %s SUMMARY: %d/%d required client scenarios passed (auth: %d/%d, other: %d/%d; %d/%d checks); failed: %v; not run (unimplemented auth extensions): %v",
				rev, passed, total, authPassed, authTotal, passed-authPassed, total-authTotal, checks, checksTotal, failed, skipped)
		})
	}
}

func runScenario(t *testing.T, node, suite, client, rev, name string) (ok bool, passed, total int, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(suite, "dist", "index.js"), "client",
		"--command", client, "--scenario", name, "--spec-version", rev, "-o", t.TempDir())
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	b, err := cmd.CombinedOutput()
	out = string(b)
	m := passedRE.FindStringSubmatch(out)
	if m == nil {
		return false, 0, 0, out
	}
	passed, _ = strconv.Atoi(m[1])
	total, _ = strconv.Atoi(m[2])
	failedN, _ := strconv.Atoi(m[3])
	return err == nil && failedN == 0 && total > 0, passed, total, fmt.Sprintf("%s", out)
}
