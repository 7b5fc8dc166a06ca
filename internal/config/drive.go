package config

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
)

// KindDrive is the kind of a Google Drive provider entry.
const KindDrive = "drive"

// Drive makes an entry a Google Drive provider connection: tools over the
// Drive v3 REST API that a generic OpenAPI client cannot express
// (multipart uploads, alt=media downloads, path lookups). Its credential
// is the entry's auth: the caller's own Google token through an OAuth
// sign-in, or a service account.
type Drive struct {
	// RootFolderID is the folder paths resolve from, and what list_files
	// lists without q or folderId; default "root" (My Drive). With a
	// service account, the folder or Shared Drive shared with it.
	RootFolderID string `yaml:"rootFolderId"`
	// APIBaseURL and UploadBaseURL are where requests go; defaults
	// Google's (https://www.googleapis.com/drive/v3 and
	// https://www.googleapis.com/upload/drive/v3). Tests point them at a
	// fake.
	APIBaseURL    string `yaml:"apiBaseUrl"`
	UploadBaseURL string `yaml:"uploadBaseUrl"`
	// RequestTimeoutMs bounds one tool call (all its requests), default
	// 60000.
	RequestTimeoutMs int `yaml:"requestTimeoutMs"`
	// MaxFileBytes bounds what read_file returns and what a write sends,
	// default 5 MiB (Google's bound for a single-request upload).
	MaxFileBytes int64 `yaml:"maxFileBytes"`
	// FollowRedirects says which redirects a call follows, as on an
	// openapi entry (default same-origin).
	FollowRedirects string `yaml:"followRedirects"`
}

// ServiceAccount is a Google service account a drive entry acts as: the
// JSON key (as Google's console downloads it) held as a secret, exchanged
// for access tokens with the JWT-bearer grant (RFC 7523) at the key's
// token_uri.
type ServiceAccount struct {
	// Key is the JSON key; it must be a ${secret:NAME} reference, so the
	// key never sits in the config file.
	Key string `yaml:"key" json:"-"`
	// Scopes asked for; default https://www.googleapis.com/auth/drive.file
	// (files the app created or was given), the least a Drive needs.
	Scopes []string `yaml:"scopes"`
	// Subject is the user a domain-wide delegated account acts as; empty
	// for the account itself.
	Subject string `yaml:"subject"`
}

// MaxDriveFileBytes bounds maxFileBytes: a file is held in memory whole.
const MaxDriveFileBytes = 64 << 20

var (
	secretOnlyRE = regexp.MustCompile(`^\$\{secret:[A-Za-z0-9._-]+\}$`)
	// driveIDRE is the shape of a Drive id (or the alias root): ids are
	// put into queries and paths, so nothing else may pass.
	driveIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)
)

func (d *Drive) validate(ps *problems, path string) {
	if d.RootFolderID != "" && !driveIDRE.MatchString(d.RootFolderID) {
		ps.add(path+".rootFolderId", "must be a Drive folder id (letters, digits, _ and -) or root")
	}
	for field, raw := range map[string]string{"apiBaseUrl": d.APIBaseURL, "uploadBaseUrl": d.UploadBaseURL} {
		if raw == "" {
			continue
		}
		if u, err := url.Parse(raw); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
			ps.add(path+"."+field, "must be an absolute http:// or https:// URL without credentials or query")
		}
	}
	if d.RequestTimeoutMs < 0 {
		ps.add(path+".requestTimeoutMs", "must not be negative")
	}
	if d.MaxFileBytes < 0 || d.MaxFileBytes > MaxDriveFileBytes {
		ps.add(path+".maxFileBytes", "must be between 0 (the default, 5 MiB) and %d (64 MiB), not %d", MaxDriveFileBytes, d.MaxFileBytes)
	}
	validateRedirects(ps, path+".followRedirects", d.FollowRedirects)
}

// validateDriveAuth checks a drive entry's auth: exactly one of oauth and
// serviceAccount. Without one the entry could make no call at all.
func (c Connection) validateDriveAuth(ps *problems, path string) {
	a := c.Auth
	if a == nil {
		ps.add(path, "is required on a drive connection: auth: {oauth: {…}, perUser: true} (each caller's own Google account) or auth: {serviceAccount: {key: \"${secret:NAME}\"}}")
		return
	}
	if (a.OAuth != nil) == (a.ServiceAccount != nil) {
		ps.add(path, "on a drive connection needs exactly one of oauth and serviceAccount")
	}
	if a.GitHubApp != nil {
		ps.add(path+".githubApp", "is not supported on a drive connection: its tokens are for GitHub")
	}
	if o := a.OAuth; o != nil {
		if o.ClientID == "" {
			ps.add(path+".oauth.clientId", "is required on a drive connection: Google registers no clients on the fly; create an OAuth client (web application) in the Google Cloud console")
		}
		o.validateScopesAndIssuer(ps, path+".oauth")
	}
	if sa := a.ServiceAccount; sa != nil {
		sa.validate(ps, path+".serviceAccount")
		if a.PerUser {
			ps.add(path+".perUser", "does not apply to a service account: every call acts as the account")
		}
	}
}

func (sa *ServiceAccount) validate(ps *problems, path string) {
	if !secretOnlyRE.MatchString(strings.TrimSpace(sa.Key)) {
		ps.add(path+".key", "must be a ${secret:NAME} reference to the service account's JSON key (a key in the config file would be readable by anyone who reads the file)")
	}
	for i, s := range sa.Scopes {
		if u, err := url.Parse(s); err != nil || u.Scheme != "https" || u.Host == "" {
			ps.add(fmt.Sprintf("%s.scopes[%d]", path, i), "must be an https scope URL such as https://www.googleapis.com/auth/drive.file")
		}
	}
	if sa.Subject != "" && !strings.Contains(sa.Subject, "@") {
		ps.add(path+".subject", "must be the email address of the user the account acts as")
	}
}

// validateScopesAndIssuer checks what an oauth mapping holds besides the
// client: scope tokens, and an issuer that is an https URL (http only on
// loopback, for tests), as the sign-in's discovery requires.
func (o *OAuth) validateScopesAndIssuer(ps *problems, path string) {
	for i, sc := range o.Scopes {
		if sc == "" || strings.ContainsAny(sc, " \t\r\n\"\\") {
			ps.add(fmt.Sprintf("%s.scopes[%d]", path, i), "must be one scope token, without spaces or quotes")
		}
	}
	if o.Issuer == "" {
		return
	}
	u, err := url.Parse(o.Issuer)
	loopback := err == nil && u.Scheme == "http" && (u.Hostname() == "localhost" || net.ParseIP(u.Hostname()) != nil && net.ParseIP(u.Hostname()).IsLoopback())
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || (u.Scheme != "https" && !loopback) {
		ps.add(path+".issuer", "must be the authorization server's https URL without query or fragment (http only on loopback)")
	}
}
