package authz_test

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/authz"
)

func TestRoles(t *testing.T) {
	t.Parallel()
	roles := func(rs ...authz.Role) authz.Principal { return authz.Principal{Name: "k", Roles: rs} }
	cases := []struct {
		name string
		p    authz.Principal
		has  map[authz.Role]bool
	}{
		{"no roles is run", roles(), map[authz.Role]bool{authz.Run: true, authz.Read: false, authz.Approve: false, authz.Admin: false}},
		{"read alone cannot run", roles(authz.Read), map[authz.Role]bool{authz.Run: false, authz.Read: true, authz.Admin: false}},
		{"admin holds the built-in roles", roles(authz.Admin), map[authz.Role]bool{authz.Run: true, authz.Read: true, authz.Approve: true, "oncall": false}},
		{"a role of one's own", roles("oncall"), map[authz.Role]bool{"oncall": true, authz.Run: false, authz.Approve: false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for r, want := range c.has {
				if got := c.p.Has(r); got != want {
					t.Errorf("Has(%s) = %v, want %v", r, got, want)
				}
			}
		})
	}
}

func TestOwnership(t *testing.T) {
	t.Parallel()
	alice := authz.Principal{Name: "alice"}
	auditor := authz.Principal{Name: "aud", Roles: []authz.Role{authz.Read}}
	admin := authz.Principal{Name: "root", Roles: []authz.Role{authz.Admin}}
	if !alice.Sees("alice") || alice.Sees("bob") || !auditor.Sees("bob") || !admin.Sees("bob") {
		t.Fatal("Sees")
	}
	if !alice.Acts("alice") || alice.Acts("bob") || auditor.Acts("bob") || !admin.Acts("bob") {
		t.Fatal("Acts")
	}
	readOnly := authz.Principal{Name: "ro", Roles: []authz.Role{authz.Read}}
	if readOnly.Acts("ro") {
		t.Fatal("a read-only key changed its own work")
	}
}

func TestApproversAndPush(t *testing.T) {
	t.Parallel()
	ap := authz.Principal{Name: "sam", Roles: []authz.Role{authz.Approve, "oncall"}, Approve: []string{"prod.*"}, Push: []string{"deploys"}}
	for _, c := range []struct {
		got, want bool
		what      string
	}{
		{ap.MayApprove("prod", "deploy"), true, "within globs"},
		{ap.MayApprove("billing", "refund"), false, "outside globs"},
		{ap.Named(nil), true, "no approvers named"},
		{ap.Named([]string{"sam"}), true, "by name"},
		{ap.Named([]string{"role:oncall"}), true, "by role"},
		{ap.Named([]string{"lee", "role:sre"}), false, "not named"},
		{ap.MayPush("deploys"), true, "push grant"},
		{ap.MayPush("billing"), false, "no push grant"},
		{authz.Principal{Roles: []authz.Role{authz.Admin}}.MayPush("billing"), true, "admin pushes"},
		{authz.ValidApprover("role:On Call"), false, "bad role"},
		{authz.ValidRole("oncall"), true, "own role"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

func TestReservedNames(t *testing.T) {
	t.Parallel()
	for name, reserved := range map[string]bool{
		authz.OperatorName: true, authz.HostName: true, authz.SystemName: true, authz.GeneratedName: true,
		authz.EnvKeyName(0): true, "env-12": true, "env-007": true,
		"ci": false, "env": false, "env-": false, "env-1a": false, "Admin": false, "environment-1": false,
	} {
		if got := authz.Reserved(name) != ""; got != reserved {
			t.Errorf("Reserved(%q) = %q, want reserved %v", name, authz.Reserved(name), reserved)
		}
	}
	if authz.EnvKeyName(0) != "env-1" {
		t.Errorf("EnvKeyName(0) = %q, want env-1", authz.EnvKeyName(0))
	}
}
