package githubapp

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Scope is what one token is for: one repository and the permissions a
// call needs. Permissions maps GitHub's permission names (issues,
// contents, pull_requests, …) to read, write or admin.
type Scope struct {
	Owner       string
	Repo        string
	Permissions map[string]string
}

var (
	// Owner and repository names go into URL paths: no slash, no dot
	// segment, nothing to escape.
	ownerRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`)
	repoRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,100}$`)
	permRE  = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
	levels  = map[string]int{"read": 1, "write": 2, "admin": 3}
)

// metadataPermission is mandatory for any App with repository access, so
// GitHub grants it to every token; asking for it keeps the cache key and
// the grant check honest.
const metadataPermission = "metadata"

// normalize checks s and returns it with metadata: read added when the
// caller did not name metadata.
func (s Scope) normalize() (Scope, error) {
	if !ownerRE.MatchString(s.Owner) {
		return s, errorf(InvalidRequest, "owner %q is not a GitHub account name", clip(s.Owner))
	}
	if !repoRE.MatchString(s.Repo) || s.Repo == "." || s.Repo == ".." {
		return s, errorf(InvalidRequest, "repo %q is not a GitHub repository name", clip(s.Repo))
	}
	if len(s.Permissions) == 0 {
		return s, errorf(InvalidRequest, "permissions are required: a token without them would carry every permission the installation has")
	}
	perms := make(map[string]string, len(s.Permissions)+1)
	for name, level := range s.Permissions {
		if !permRE.MatchString(name) {
			return s, errorf(InvalidRequest, "permission name %q is not a GitHub permission", clip(name))
		}
		if levels[level] == 0 {
			return s, errorf(InvalidRequest, "permission %s: level %q is not read, write or admin", name, clip(level))
		}
		perms[name] = level
	}
	if _, ok := perms[metadataPermission]; !ok {
		perms[metadataPermission] = "read"
	}
	s.Permissions = perms
	return s, nil
}

// cacheID names a normalized scope for this App on this GitHub: a digest
// of the API base URL, the App id, the owner and repo (lower-cased, as
// GitHub compares them) and the sorted permissions.
func (s Scope) cacheID(apiBase, appID string) string {
	var b strings.Builder
	b.WriteString(apiBase + "\n" + appID + "\n" + strings.ToLower(s.Owner) + "/" + strings.ToLower(s.Repo) + "\n")
	for _, name := range slices.Sorted(maps.Keys(s.Permissions)) {
		b.WriteString(name + "=" + s.Permissions[name] + ",")
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:16])
}

// missing lists the permissions asked for that granted does not cover
// (absent, or at a lower level), sorted.
func missing(asked, granted map[string]string) []string {
	var out []string
	for name, level := range asked {
		if levels[granted[name]] < levels[level] {
			out = append(out, name+":"+level)
		}
	}
	slices.Sort(out)
	return out
}

// clip keeps caller input in messages short.
func clip(s string) string { return clipTo(s, 64) }

func clipTo(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Check reports what Token would refuse about the scope (an
// invalid_request Error), so a configuration can be checked at load.
func (s Scope) Check() error {
	_, err := s.normalize()
	return err
}
