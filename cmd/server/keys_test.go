package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/oauth"
)

// TestKeyNamesArePrincipals: the server does not start with two keys of
// one name, with a file key named like a key of PATCHBAY_API_KEYS, or
// with a key named like a principal patchbay uses itself (the host's
// runs, shared sign-ins, expired approvals' decider, the generated key).
func TestKeyNamesArePrincipals(t *testing.T) {
	t.Parallel()
	names := []string{"ci", "ci", "env-1", harness.HostPrincipal, oauth.SharedPrincipal, authz.SystemName, authz.GeneratedName}
	var file strings.Builder
	file.WriteString("apiKeys:\n")
	for i, n := range names {
		fmt.Fprintf(&file, "  - { name: %q, key: key-%d, allowlist: default }\n", n, i)
	}
	cfg := writeConfig(t, file.String())
	err := run(context.Background(), nil, envMap{"PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "env-key"}.get, io.Discard)
	var ve *config.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("run = %v, want a config error", err)
	}
	want := map[string]string{
		"apiKeys[1].name": `"ci" is also the name of apiKeys[0]`,
		"apiKeys[2].name": "PATCHBAY_API_KEYS[0]",
		"apiKeys[3].name": "is reserved",
		"apiKeys[4].name": "is reserved",
		"apiKeys[5].name": "is reserved",
		"apiKeys[6].name": "is reserved",
	}
	for _, p := range ve.Problems {
		if msg, ok := want[p.Path]; ok && strings.Contains(p.Message, msg) {
			delete(want, p.Path)
		} else {
			t.Errorf("unexpected problem %s", p)
		}
	}
	for path, msg := range want {
		t.Errorf("missing problem %s: …%s…", path, msg)
	}
}
