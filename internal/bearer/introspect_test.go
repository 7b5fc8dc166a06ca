package bearer_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/bearer"
)

// introspection is a loopback RFC 7662 endpoint answering from a table of
// tokens, counting the questions and checking patchbay's credentials.
type introspection struct {
	srv   *httptest.Server
	asked atomic.Int32

	mu      sync.Mutex
	answers map[string]map[string]any // by token; missing: 401 {"active": false}, as the SDK's demo answers
}

func newIntrospection(t *testing.T) *introspection {
	t.Helper()
	in := &introspection{answers: map[string]map[string]any{}}
	in.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.asked.Add(1)
		id, secret, ok := r.BasicAuth()
		if r.Method != http.MethodPost || !ok || id != "patchbay" || secret != "s3cret" {
			http.Error(w, `{"error":"invalid_client"}`, http.StatusUnauthorized)
			return
		}
		if err := r.ParseForm(); err != nil || r.PostForm.Get("token_type_hint") != "access_token" {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		in.mu.Lock()
		ans, ok := in.answers[r.PostForm.Get("token")]
		in.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.PostForm.Get("token") == "broken":
			w.WriteHeader(http.StatusBadGateway)
			return
		case !ok:
			w.WriteHeader(http.StatusUnauthorized)
			ans = map[string]any{"active": false, "error": "Unauthorized"}
		}
		_ = json.NewEncoder(w).Encode(ans)
	}))
	t.Cleanup(in.srv.Close)
	return in
}

func (in *introspection) set(token string, ans map[string]any) {
	in.mu.Lock()
	in.answers[token] = ans
	in.mu.Unlock()
}

func TestIntrospection(t *testing.T) {
	t.Parallel()
	in := newIntrospection(t)
	b := setup(t, func(o *bearer.Options) {
		o.IntrospectionURL = in.srv.URL + "/introspect"
		o.ClientID, o.ClientSecret = "patchbay", "s3cret"
	})
	now := b.clock.Now()
	exp := float64(now.Add(time.Hour).Unix())
	active := func(kv ...any) map[string]any {
		m := map[string]any{"active": true, "sub": "user-1", "aud": resource, "exp": exp, "iss": b.is.url}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = kv[i+1]
			}
		}
		return m
	}
	tests := []struct {
		name string
		ans  map[string]any // nil: the endpoint does not know the token
		want string
	}{
		{"active", active(), "alice"},
		{"audience in a list", active("aud", []any{"https://other.example", resource}), "alice"},
		{"resource instead of aud", active("aud", nil, "resource", resource), "alice"},
		{"no issuer named", active("iss", nil), "alice"},
		{"unknown to the issuer", nil, ""},
		{"inactive", map[string]any{"active": false}, ""},
		{"active as a string", active("active", "true"), ""},
		{"another audience", active("aud", "https://other.example/mcp"), ""},
		{"no audience", active("aud", nil), ""},
		{"expired", active("exp", float64(now.Add(-time.Minute).Unix())), ""},
		{"no exp", active("exp", nil), ""},
		{"not yet valid", active("nbf", float64(now.Add(time.Hour).Unix())), ""},
		{"another issuer", active("iss", "https://evil.example"), ""},
		{"a refresh token", active("token_type", "refresh_token"), ""},
		{"unknown subject", active("sub", "mallory"), ""},
		{"no subject", active("sub", nil, "client_id", "user-1"), ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			token := "opaque-" + string(rune('a'+i))
			if tt.ans != nil {
				in.set(token, tt.ans)
			}
			p, err := b.v.Verify(t.Context(), token)
			if tt.want == "" {
				if !errors.Is(err, bearer.ErrRefused) {
					t.Fatalf("Verify = %+v, %v; want ErrRefused", p, err)
				}
				checkNoToken(t, err, token)
				return
			}
			if err != nil || p.Name != tt.want {
				t.Fatalf("Verify = %+v, %v; want %s", p, err, tt.want)
			}
		})
	}

	// An active answer is reused for a while, then asked again.
	in.set("cached", active())
	for range 3 {
		if _, err := b.v.Verify(t.Context(), "cached"); err != nil {
			t.Fatal(err)
		}
	}
	before := in.asked.Load()
	b.clock.advance(31 * time.Second)
	if _, err := b.v.Verify(t.Context(), "cached"); err != nil {
		t.Fatal(err)
	}
	if in.asked.Load() != before+1 {
		t.Errorf("asked %d times after the cache's time, want once more", in.asked.Load()-before)
	}
	// Never past the token's exp, even within the cache's time.
	in.set("short", active("exp", float64(b.clock.Now().Add(5*time.Second).Unix())))
	if _, err := b.v.Verify(t.Context(), "short"); err != nil {
		t.Fatal(err)
	}
	in.set("short", map[string]any{"active": false})
	b.clock.advance(6 * time.Second)
	if _, err := b.v.Verify(t.Context(), "short"); err == nil {
		t.Error("a cached answer was used past the token's exp")
	}

	// The endpoint failing is not the token being wrong.
	_, err := b.v.Verify(t.Context(), "broken")
	checkUnavailable(t, err)

	// Wrong credentials for the endpoint: unavailable, not refused.
	b2 := setup(t, func(o *bearer.Options) {
		o.IntrospectionURL = in.srv.URL + "/introspect"
		o.ClientID, o.ClientSecret = "patchbay", "wrong"
	})
	in.set("fine", active())
	_, err = b2.v.Verify(t.Context(), "fine")
	checkUnavailable(t, err)
}

// A JWT-shaped token goes to the key set when there is one, never to
// introspection; with no keys to be had (no jwks_uri in the metadata) it
// is introspected.
func TestIntrospectionAndJWTs(t *testing.T) {
	t.Parallel()
	in := newIntrospection(t)
	b := setup(t, func(o *bearer.Options) {
		o.IntrospectionURL = in.srv.URL
		o.ClientID, o.ClientSecret = "patchbay", "s3cret"
		o.JWKSURL = ""
	})
	forged := sign(t, jwt.SigningMethodRS256, b.is.rsa2, "rsa-1", b.claims("user-1"))
	if _, err := b.v.Verify(t.Context(), forged); !errors.Is(err, bearer.ErrRefused) {
		t.Fatalf("forged JWT: %v", err)
	}
	if in.asked.Load() != 0 {
		t.Error("a JWT with keys at hand was introspected")
	}

	b = setup(t, func(o *bearer.Options) {
		o.IntrospectionURL = in.srv.URL
		o.ClientID, o.ClientSecret = "patchbay", "s3cret"
		o.JWKSURL = ""
	})
	b.is.mu.Lock()
	delete(b.is.md, "jwks_uri")
	b.is.mu.Unlock()
	tok := sign(t, jwt.SigningMethodRS256, b.is.rsa2, "k", b.claims("user-1"))
	in.set(tok, map[string]any{"active": true, "sub": "user-2", "aud": resource, "exp": float64(b.clock.Now().Add(time.Hour).Unix())})
	if p, err := b.v.Verify(t.Context(), tok); err != nil || p.Name != "oauth:user-2" {
		t.Fatalf("JWT without a key set = %+v, %v; want it introspected", p, err)
	}
}
