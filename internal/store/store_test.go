package store

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

func TestOpenEmbedded(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s, err := Open(t.Context(), "", "pb:", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	if !s.Embedded() || s.Miniredis() == nil || s.URL() != "embedded" {
		t.Errorf("Embedded = %v, Miniredis = %v, URL = %q", s.Embedded(), s.Miniredis(), s.URL())
	}
	if got := strings.Count(logs.String(), "\n"); got != 1 || !strings.Contains(logs.String(), "level=WARN") ||
		!strings.Contains(logs.String(), "nothing survives a restart") {
		t.Errorf("want one warn line about memory, got %d lines:\n%s", got, logs.String())
	}
	if got := s.Key("exec", "{exec:1}", "ledger"); got != "pb:exec:{exec:1}:ledger" {
		t.Errorf("Key = %q", got)
	}
	if got := s.Key(); got != "pb:" {
		t.Errorf("Key() = %q", got)
	}
	if err := s.Client.Set(t.Context(), s.Key("k"), "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Miniredis().Get("pb:k"); got != "v" {
		t.Errorf("stored under %q", s.Miniredis().Keys())
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if w := s.CheckDurability(t.Context()); w != nil {
		t.Errorf("CheckDurability on embedded = %q, want nil", w)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Ping(t.Context()); err == nil {
		t.Error("Ping after Close succeeded")
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url   string
		check func(t *testing.T, tg *target)
		err   string // part of the error; "" for success
	}{
		{url: "redis://localhost:6379/2", check: func(t *testing.T, tg *target) {
			if tg.mode != modeSingle || tg.single.Addr != "localhost:6379" || tg.single.DB != 2 || tg.single.TLSConfig != nil {
				t.Errorf("got %s %+v", tg.mode, tg.single)
			}
		}},
		{url: "rediss://user:p%40ss@cache.example:6380?dial_timeout=3", check: func(t *testing.T, tg *target) {
			o := tg.single
			if o.Addr != "cache.example:6380" || o.Username != "user" || o.Password != "p@ss" || o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example" || o.DialTimeout != 3*time.Second {
				t.Errorf("got %+v", o)
			}
		}},
		{url: "unix:///run/redis.sock?db=3", check: func(t *testing.T, tg *target) {
			if tg.single.Network != "unix" || tg.single.Addr != "/run/redis.sock" || tg.single.DB != 3 {
				t.Errorf("got %+v", tg.single)
			}
		}},
		{url: "redis+cluster://:pw@n1:7000,n2,[::1]:7002?addr=n4:7003&read_only=true", check: func(t *testing.T, tg *target) {
			o := tg.cluster
			want := []string{"n1:7000", "n4:7003", "n2:6379", "[::1]:7002"}
			if tg.mode != modeCluster || strings.Join(o.Addrs, " ") != strings.Join(want, " ") || o.Password != "pw" || !o.ReadOnly || o.TLSConfig != nil {
				t.Errorf("got %s %v %+v", tg.mode, o.Addrs, o)
			}
		}},
		{url: "rediss+cluster://n1:7000/", check: func(t *testing.T, tg *target) {
			if tg.cluster.TLSConfig == nil || len(tg.cluster.Addrs) != 1 {
				t.Errorf("got %+v", tg.cluster)
			}
		}},
		{url: "redis+cluster://n1:7000/3", err: "no database"},
		{url: "redis+cluster://n1:7000,,n2:7001", err: "empty host"},
		{url: "redis+sentinel://:mpw@s1:26379,s2,s3:5000/mymaster?db=2&sentinel_password=spw&dial_timeout=1s", check: func(t *testing.T, tg *target) {
			o := tg.failover
			if tg.mode != modeSentinel || o.MasterName != "mymaster" || o.DB != 2 || o.Password != "mpw" || o.SentinelPassword != "spw" ||
				strings.Join(o.SentinelAddrs, " ") != "s1:26379 s2:26379 s3:5000" || o.DialTimeout != time.Second || o.TLSConfig != nil {
				t.Errorf("got %s %+v", tg.mode, o)
			}
		}},
		{url: "rediss+sentinel://s1/mymaster", check: func(t *testing.T, tg *target) {
			o := tg.failover
			if o.MasterName != "mymaster" || o.TLSConfig == nil || o.Password != "" || o.SentinelAddrs[0] != "s1:26379" {
				t.Errorf("got %+v", o)
			}
		}},
		{url: "redis+sentinel://s1:26379", err: "master name"},
		{url: "redis+sentinel://s1:26379/a/b", err: "master name"},
		{url: "redis+sentinel://s1:26379/m?master_name=x", err: "in the path"},
		{url: "redis+sentinel://s1:26379/m?bogus=1", err: "unexpected option"},
		{url: "http://localhost:6379", err: `unsupported scheme "http"`},
		{url: "localhost:6379", err: "no scheme"},
		{url: "redis://localhost:6379?bogus=1", err: "unexpected option"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			tg, err := parseURL(tt.url)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want …%s…", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, tg)
			_ = tg.newClient().Close()
		})
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://localhost:6379/0":                       "redis://localhost:6379/0",
		"redis://:s3cret@h:1/0":                          "redis://:xxxxx@h:1/0",
		"rediss://user:s3cret@h:1":                       "rediss://user:xxxxx@h:1",
		"redis://user@h":                                 "redis://user@h",
		"redis+sentinel://:a@b@h1,h2/m?password=x&db=1":  "redis+sentinel://:xxxxx@h1,h2/m?password=xxxxx&db=1",
		"redis://h/?sentinel_password=x&Password=y#frag": "redis://h/?sentinel_password=xxxxx&Password=xxxxx#frag",
		"redis://:pa ss@h%zz":                            "redis://:xxxxx@h%zz",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenErrorsHidePasswords(t *testing.T) {
	t.Parallel()
	const pw = "Tr0ub4dor-and-3"
	tests := []struct{ url, err string }{
		{"ftp://:" + pw + "@localhost:6379", "unsupported scheme"},
		{"redis://:" + pw + "@localhost:6379?bogus=1", "unexpected option"},
		{"redis://:" + pw + "@local host:6379", "invalid Redis URL"},
		{"redis://:" + pw + "@127.0.0.1:1/0", "cannot reach Redis at redis://:xxxxx@127.0.0.1:1/0"},
		{"redis+cluster://:" + pw + "@127.0.0.1:1", "cannot reach Redis"},
		{"redis://127.0.0.1:1/0?password=" + pw, "unexpected option: password"},
		{"redis+sentinel://:" + pw + "@127.0.0.1:1/m?sentinel_password=" + pw, "cannot reach Redis"},
	}
	for _, tt := range tests {
		t.Run(tt.err, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			// Shorter than PingTimeout: the sentinel client keeps retrying
			// until the deadline.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			s, err := Open(ctx, tt.url, "pb:", slog.New(slog.NewTextHandler(&logs, nil)))
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tt.err) {
				t.Errorf("err = %v, want …%s…", err, tt.err)
			}
			if strings.Contains(err.Error(), pw) || strings.Contains(logs.String(), pw) {
				t.Errorf("password leaked:\nerr: %v\nlogs: %s", err, logs.String())
			}
		})
	}
}

func TestOpenInvalidURLIs(t *testing.T) {
	t.Parallel()
	_, err := Open(t.Context(), "nope://x", "pb:", nil)
	if !errors.Is(err, ErrInvalidURL) {
		t.Errorf("err = %v, want ErrInvalidURL", err)
	}
}

// A real-server URL pointing at miniredis: CONFIG is not implemented
// there, as on managed Redis services that disable it.
func TestCheckDurabilityWithoutConfig(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	var logs bytes.Buffer
	s, err := Open(t.Context(), "redis://"+mr.Addr()+"/0", "pb:", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if s.Embedded() {
		t.Error("Embedded() = true for a URL")
	}
	w := s.CheckDurability(t.Context())
	if len(w) != 2 || !strings.Contains(w[0], "could not check Redis maxmemory-policy") || !strings.Contains(w[1], "could not check Redis appendonly") {
		t.Errorf("warnings = %q", w)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 {
		t.Errorf("Open logged %d warnings, want 2:\n%s", n, logs.String())
	}
}

// realURL is the real Redis to test against; tests that need one skip
// without it, except in CI, where skipping would hide a gap.
func realURL(t *testing.T) string {
	url := os.Getenv("PATCHBAY_TEST_REDIS_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PATCHBAY_TEST_REDIS_URL")
		}
		t.Skip("PATCHBAY_TEST_REDIS_URL not set")
	}
	return url
}

func TestCheckDurabilityRealRedis(t *testing.T) {
	t.Parallel()
	url := realURL(t)
	var logs bytes.Buffer
	s, err := Open(t.Context(), url, "pbtest:durability:", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	cfg := func(name string) string {
		v, err := s.Client.ConfigGet(context.Background(), name).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", name, err)
		}
		return v[name]
	}
	var want []string
	if p := cfg("maxmemory-policy"); p != "noeviction" {
		want = append(want, `Redis maxmemory-policy is "`+p+`", not noeviction`)
	}
	if a := cfg("appendonly"); a != "yes" {
		want = append(want, `Redis appendonly is "`+a+`", not yes`)
	}
	got := s.CheckDurability(t.Context())
	if len(got) != len(want) {
		t.Fatalf("warnings = %q, want %d like %q", got, len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("warning %d = %q, want %q…", i, got[i], want[i])
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != len(want) {
		t.Errorf("Open logged %d warnings, want %d:\n%s", n, len(want), logs.String())
	}
	if strings.Contains(logs.String(), "nothing survives") {
		t.Error("real server logged the embedded warning")
	}
}

// TestChosenOptions: every kind of client gets patchbay's go-redis options
// (see the package doc), except those the URL sets itself; the cluster
// client follows MaxRedirects too, and reads go to masters only.
func TestChosenOptions(t *testing.T) {
	t.Parallel()
	type got struct {
		dial, read, write, pool, minBackoff, maxBackoff time.Duration
		dialerRetries                                   int
		ctxTimeout                                      bool
	}
	want := got{dialTimeout, ioTimeout, ioTimeout, poolTimeout, minRetryBackoff, maxRetryBackoff, dialerRetries, true}
	for _, tc := range []struct {
		url  string
		want got
	}{
		{"redis://h:1/0", want},
		{"redis+sentinel://s1/m", want},
		{"redis+cluster://n1,n2", want},
		{"redis://h:1/0?dial_timeout=7s&read_timeout=8s", got{7 * time.Second, 8 * time.Second, ioTimeout, poolTimeout, minRetryBackoff, maxRetryBackoff, dialerRetries, true}},
		{"redis+cluster://n1?max_retry_backoff=2s&dialer_retries=4", got{dialTimeout, ioTimeout, ioTimeout, poolTimeout, minRetryBackoff, 2 * time.Second, 4, true}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			tg, err := parseURL(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			var g got
			switch tg.mode {
			case modeSingle:
				o := tg.single
				g = got{o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MinRetryBackoff, o.MaxRetryBackoff, o.DialerRetries, o.ContextTimeoutEnabled}
			case modeSentinel:
				o := tg.failover
				g = got{o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MinRetryBackoff, o.MaxRetryBackoff, o.DialerRetries, o.ContextTimeoutEnabled}
			case modeCluster:
				o := tg.cluster
				g = got{o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout, o.MinRetryBackoff, o.MaxRetryBackoff, o.DialerRetries, o.ContextTimeoutEnabled}
				if o.MaxRedirects != maxRedirects || o.ReadOnly || o.RouteRandomly || o.RouteByLatency {
					t.Errorf("MaxRedirects %d, ReadOnly %v, RouteRandomly %v, RouteByLatency %v", o.MaxRedirects, o.ReadOnly, o.RouteRandomly, o.RouteByLatency)
				}
			}
			if g != tc.want {
				t.Errorf("got %+v\nwant %+v", g, tc.want)
			}
		})
	}
}
