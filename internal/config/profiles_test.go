package config_test

import (
	"strings"
	"testing"
)

func TestProfilesDirAndBinding(t *testing.T) {
	t.Parallel()
	const file = "profilesDir: profiles\nconnections:\n  web:\n    binding: playwright-browser\n    mcp: {command: npx}\n"
	c, err := load(env{"PATCHBAY_CONFIG": "/etc/patchbay/config.yaml"}, files{"/etc/patchbay/config.yaml": file})
	if err != nil {
		t.Fatal(err)
	}
	if c.ProfilesDir != "/etc/patchbay/profiles" || c.File.Connections["web"].Binding != "playwright-browser" {
		t.Fatalf("profilesDir = %q, connection = %+v", c.ProfilesDir, c.File.Connections["web"])
	}
	c, err = load(env{"PATCHBAY_CONFIG": "/etc/patchbay/config.yaml", "PATCHBAY_PROFILES_DIR": "/srv/profiles"}, files{"/etc/patchbay/config.yaml": file})
	if err != nil || c.ProfilesDir != "/srv/profiles" {
		t.Fatalf("the variable does not win: %v %v", c, err)
	}
	_, err = load(env{"PATCHBAY_CONFIG": "c.yaml"}, files{"c.yaml": "connections:\n  t:\n    binding: x\n    cron: {schedule: '@hourly'}\n"})
	if err == nil || !strings.Contains(err.Error(), "connections.t.binding") {
		t.Fatalf("binding on a cron entry: %v", err)
	}
	_, err = load(env{"PATCHBAY_CONFIG": "c.yaml"}, files{"c.yaml": "connections:\n  b:\n    binding: playwright-browser\n    mcp: {command: npx}\n    pool: {max: 2}\n"})
	if err != nil {
		t.Fatalf("binding on a pool: %v", err)
	}
}
