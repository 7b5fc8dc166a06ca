package store

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Modes of connection, as logged.
const (
	modeSingle   = "single"
	modeCluster  = "cluster"
	modeSentinel = "sentinel"
)

// target is a parsed URL: the options for exactly one kind of client.
type target struct {
	mode     string
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

func (t *target) newClient() redis.UniversalClient {
	switch t.mode {
	case modeCluster:
		cc := redis.NewClusterClient(t.cluster)
		watchCluster(cc)
		return cc
	case modeSentinel:
		return redis.NewFailoverClient(t.failover)
	default:
		return redis.NewClient(t.single)
	}
}

const schemes = "redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"

// parseURL maps the URL forms in the package doc to go-redis options. Its
// errors may quote the URL; Open scrubs them.
func parseURL(raw string) (*target, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("no scheme; want %s", schemes)
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, err
		}
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		tuneSingle(o, u.Query())
		return &target{mode: modeSingle, single: o}, nil
	case "redis+cluster", "rediss+cluster":
		return parseCluster(strings.ToLower(strings.TrimSuffix(scheme, "+cluster")), rest)
	case "redis+sentinel", "rediss+sentinel":
		return parseSentinel(strings.ToLower(strings.TrimSuffix(scheme, "+sentinel")), rest)
	default:
		return nil, fmt.Errorf("unsupported scheme %q; want %s", scheme, schemes)
	}
}

// authority is the part of a URL between "://" and the path, split up.
type authority struct {
	userinfo string // raw, without the "@"; "" when absent
	hasUser  bool
	hosts    []string
	path     string
	query    string
}

func splitAuthority(rest, defaultPort string) (authority, error) {
	var a authority
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	host, tail := rest[:end], rest[end:]
	if at := strings.LastIndex(host, "@"); at >= 0 {
		a.userinfo, a.hasUser, host = host[:at], true, host[at+1:]
	}
	tail, _, _ = strings.Cut(tail, "#")
	a.path, a.query, _ = strings.Cut(tail, "?")
	for h := range strings.SplitSeq(host, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return a, errors.New("empty host in the host list")
		}
		a.hosts = append(a.hosts, withPort(h, defaultPort))
	}
	return a, nil
}

// withPort adds the default port to a host given without one.
func withPort(h, port string) string {
	if _, _, err := net.SplitHostPort(h); err == nil {
		return h
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		return h + ":" + port
	}
	if !strings.Contains(h, ":") {
		return net.JoinHostPort(h, port)
	}
	return h // a bare IPv6 address or garbage; go-redis will say which
}

// parseCluster rewrites the comma-separated seed list into the addr=
// parameters ParseClusterURL takes.
func parseCluster(base, rest string) (*target, error) {
	a, err := splitAuthority(rest, "6379")
	if err != nil {
		return nil, err
	}
	if a.path != "" && a.path != "/" {
		return nil, errors.New("a cluster URL has no database path (Redis Cluster has only database 0)")
	}
	var b strings.Builder
	b.WriteString(base + "://")
	if a.hasUser {
		b.WriteString(a.userinfo + "@")
	}
	b.WriteString(a.hosts[0])
	q := a.query
	for _, h := range a.hosts[1:] {
		if q != "" {
			q += "&"
		}
		q += "addr=" + url.QueryEscape(h)
	}
	if q != "" {
		b.WriteString("?" + q)
	}
	o, err := redis.ParseClusterURL(b.String())
	if err != nil {
		return nil, err
	}
	query, err := url.ParseQuery(a.query)
	if err != nil {
		return nil, fmt.Errorf("bad query: %w", err)
	}
	tuneCluster(o, query)
	return &target{mode: modeCluster, cluster: o}, nil
}

// parseSentinel turns the sentinel URL into ParseFailoverURL's form:
// master name from the path into master_name=, extra sentinels into addr=,
// and the userinfo applied to the master rather than the sentinels.
func parseSentinel(base, rest string) (*target, error) {
	a, err := splitAuthority(rest, "26379")
	if err != nil {
		return nil, err
	}
	name, err := url.PathUnescape(strings.Trim(a.path, "/"))
	if err != nil || name == "" || strings.Contains(name, "/") {
		return nil, errors.New("the path must be the master name: redis+sentinel://host1:26379,host2:26379/mymaster")
	}
	q, err := url.ParseQuery(a.query)
	if err != nil {
		return nil, fmt.Errorf("bad query: %w", err)
	}
	if q.Has("master_name") {
		return nil, errors.New("give the master name in the path, not as master_name=")
	}
	sentinelUser, sentinelPassword := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	q.Set("master_name", name)
	for _, h := range a.hosts[1:] {
		q.Add("addr", h)
	}
	o, err := redis.ParseFailoverURL(base + "://" + a.hosts[0] + "/?" + q.Encode())
	if err != nil {
		return nil, err
	}
	if a.hasUser {
		u, err := url.Parse("redis://" + a.userinfo + "@h")
		if err != nil || u.User == nil {
			return nil, errors.New("bad user or password")
		}
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPassword
	tuneSentinel(o, q)
	return &target{mode: modeSentinel, failover: o}, nil
}

var passwordParamRE = regexp.MustCompile(`(?i)([?&](?:sentinel_)?password=)([^&#]*)`)

// RedactURL returns raw with the password of its userinfo and any
// password= or sentinel_password= parameter replaced by "xxxxx". It works
// on URLs that do not parse, since those are the ones that end up in error
// messages.
func RedactURL(raw string) string {
	if scheme, rest, ok := strings.Cut(raw, "://"); ok {
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		host := rest[:end]
		if at := strings.LastIndex(host, "@"); at >= 0 {
			if user, _, hasPassword := strings.Cut(host[:at], ":"); hasPassword {
				host = user + ":xxxxx" + host[at:]
			}
		}
		raw = scheme + "://" + host + rest[end:]
	}
	return passwordParamRE.ReplaceAllString(raw, "${1}xxxxx")
}

// scrub replaces every password found in raw, in its escaped and unescaped
// forms, with "xxxxx" in msg.
func scrub(msg, raw string) string {
	var secrets []string
	add := func(s string) {
		if s == "" {
			return
		}
		secrets = append(secrets, s)
		if u, err := url.PathUnescape(s); err == nil {
			secrets = append(secrets, u)
		}
		if u, err := url.QueryUnescape(s); err == nil {
			secrets = append(secrets, u)
		}
	}
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
			}
		}
	}
	for _, m := range passwordParamRE.FindAllStringSubmatch(raw, -1) {
		add(m[2])
	}
	// Longest first, so a password that contains another is not left
	// half replaced.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
