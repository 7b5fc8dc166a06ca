package config_test

import (
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

// TestLoadDrive: drive entries with each auth, and the mistakes a user
// can make in them, each reported at its field.
func TestLoadDrive(t *testing.T) {
	t.Parallel()
	const sa = `auth: { serviceAccount: { key: "${secret:drive.key}" } }`
	tests := []struct {
		name  string
		conn  string // the YAML of connections.d
		check func(t *testing.T, c config.Connection)
		wants []want
	}{
		{
			name: "service account",
			conn: `{ drive: { rootFolderId: 0AbC-d_1, apiBaseUrl: "http://127.0.0.1:9/drive/v3", maxFileBytes: 1024 },
				auth: { serviceAccount: { key: "${secret:drive.key}", scopes: ["https://www.googleapis.com/auth/drive"], subject: a@example.com } } }`,
			check: func(t *testing.T, c config.Connection) {
				if c.Kind() != config.KindDrive || c.Drive.RootFolderID != "0AbC-d_1" || c.Drive.MaxFileBytes != 1024 ||
					c.Auth.ServiceAccount.Key != "${secret:drive.key}" || c.Auth.ServiceAccount.Subject != "a@example.com" {
					t.Errorf("conn = %+v drive = %+v auth = %+v", c, c.Drive, c.Auth.ServiceAccount)
				}
			},
		},
		{
			name: "per user",
			conn: `{ drive: {}, auth: { oauth: { clientId: c.apps.googleusercontent.com, clientSecret: "${env:CSEC}", issuer: "https://accounts.google.com" }, perUser: true } }`,
			check: func(t *testing.T, c config.Connection) {
				if !c.Auth.PerUser || c.Auth.OAuth.Issuer != "https://accounts.google.com" {
					t.Errorf("auth = %+v", c.Auth)
				}
			},
		},
		{name: "no auth", conn: `{ drive: {} }`, wants: []want{{"connections.d.auth", "is required on a drive connection"}}},
		{name: "both", conn: `{ drive: {}, auth: { oauth: { clientId: c }, serviceAccount: { key: "${secret:k}" } } }`,
			wants: []want{{"connections.d.auth", "exactly one of oauth and serviceAccount"}}},
		{name: "oauth without client", conn: `{ drive: {}, auth: { oauth: {}, perUser: true } }`, wants: []want{{"connections.d.auth.oauth.clientId", "is required"}}},
		{name: "plain issuer", conn: `{ drive: {}, auth: { oauth: { clientId: c, issuer: "http://accounts.example.com" } } }`,
			wants: []want{{"connections.d.auth.oauth.issuer", "https URL"}}},
		{name: "key in the file", conn: `{ drive: {}, auth: { serviceAccount: { key: '{"type": "service_account"}' } } }`,
			wants: []want{{"connections.d.auth.serviceAccount.key", "must be a ${secret:NAME} reference"}}},
		{name: "bad scope and subject", conn: `{ drive: {}, auth: { serviceAccount: { key: "${secret:k}", scopes: [drive.file], subject: alice } } }`,
			wants: []want{{"connections.d.auth.serviceAccount.scopes[0]", "https scope URL"}, {"connections.d.auth.serviceAccount.subject", "email address"}}},
		{name: "perUser service account", conn: `{ drive: {}, auth: { serviceAccount: { key: "${secret:k}" }, perUser: true } }`,
			wants: []want{{"connections.d.auth.perUser", "does not apply to a service account"}}},
		{name: "bad folder and URLs", conn: `{ drive: { rootFolderId: "x' or 'a", apiBaseUrl: "ftp://h", uploadBaseUrl: "https://u:p@h/x" }, ` + sa + ` }`,
			wants: []want{{"connections.d.drive.apiBaseUrl", "absolute http"}, {"connections.d.drive.rootFolderId", "Drive folder id"}, {"connections.d.drive.uploadBaseUrl", "without credentials"}}},
		{name: "limits", conn: `{ drive: { maxFileBytes: 1000000000, requestTimeoutMs: -1, followRedirects: yes }, ` + sa + ` }`,
			wants: []want{{"connections.d.drive.followRedirects", "none, same-origin (the default) or any"}, {"connections.d.drive.maxFileBytes", "between 0"}, {"connections.d.drive.requestTimeoutMs", "must not be negative"}}},
		{name: "unknown field", conn: `{ drive: { folder: x }, ` + sa + ` }`, wants: []want{{"connections.d.drive.folder", "unknown field"}}},
		{name: "two kinds", conn: `{ drive: {}, cron: { schedule: "* * * * *" }, ` + sa + ` }`, wants: []want{{"connections.d", "has drive and cron"}}},
		{name: "service account elsewhere", conn: `{ mcp: { url: "https://h/mcp" }, auth: { oauth: {}, serviceAccount: { key: "${secret:k}" } } }`,
			wants: []want{{"connections.d.auth.serviceAccount", "only supported on a drive connection"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := load(env{"PATCHBAY_CONFIG": "f", "CSEC": "sekrit-1"}, files{"f": "connections:\n  d: " + tt.conn + "\n"})
			checkProblems(t, err, tt.wants...)
			if err != nil && strings.Contains(err.Error(), "sekrit-1") {
				t.Errorf("error quotes a secret:\n%v", err)
			}
			if err == nil && tt.check != nil {
				tt.check(t, c.File.Connections["d"])
			}
		})
	}
}
