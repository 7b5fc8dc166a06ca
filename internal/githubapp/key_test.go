package githubapp_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/githubapp"
)

func pemOf(t testing.TB, kind string, der []byte) string {
	t.Helper()
	return string(pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}))
}

func TestParsePrivateKeyForms(t *testing.T) {
	key := testKey()
	pkcs1 := pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
	der8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8 := pemOf(t, "PRIVATE KEY", der8)
	escaped := strings.ReplaceAll(pkcs1, "\n", `\n`)
	for name, in := range map[string]string{
		"PKCS#1":                      pkcs1,
		"PKCS#8":                      pkcs8,
		"literal \\n escapes":         escaped,
		"CRLF":                        strings.ReplaceAll(pkcs8, "\n", "\r\n"),
		"literal \\r\\n escapes":      strings.ReplaceAll(pkcs1, "\n", `\r\n`),
		"double quotes and escapes":   `"` + escaped + `"`,
		"single quotes":               "'" + pkcs8 + "'",
		"surrounding whitespace":      "\n  " + pkcs1 + "\n\n",
		"base64-wrapped PKCS#1":       base64.StdEncoding.EncodeToString([]byte(pkcs1)),
		"base64-wrapped, line-broken": wrap(base64.StdEncoding.EncodeToString([]byte(pkcs8)), 76),
		"base64-wrapped, quoted":      `"` + base64.StdEncoding.EncodeToString([]byte(escaped)) + `"`,
		"folded onto one line":        strings.ReplaceAll(strings.TrimSpace(pkcs1), "\n", " "),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := githubapp.ParsePrivateKey(in)
			if err != nil {
				t.Fatalf("ParsePrivateKey: %v", err)
			}
			if !got.Equal(key) {
				t.Fatal("parsed a different key")
			}
		})
	}
}

func TestParsePrivateKeyRefuses(t *testing.T) {
	key := testKey()
	pub := pemOf(t, "PUBLIC KEY", must(x509.MarshalPKIXPublicKey(&key.PublicKey)))
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecPEM := pemOf(t, "PRIVATE KEY", must(x509.MarshalPKCS8PrivateKey(ec)))
	pkcs1 := pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
	lines := strings.Split(pkcs1, "\n")
	truncated := strings.Join(append(lines[:5:5], lines[len(lines)-2:]...), "\n")
	encrypted := strings.Replace(pkcs1, "-----\n", "-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00112233445566778899AABBCCDDEEFF\n\n", 1)
	for name, in := range map[string]string{
		"empty":             "",
		"text":              "not a key",
		"base64 of garbage": base64.StdEncoding.EncodeToString([]byte("hello world")),
		"public key":        pub,
		"EC key":            ecPEM,
		"truncated":         truncated,
		"no END line":       strings.Split(pkcs1, "-----END")[0],
		"encrypted PEM":     encrypted,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := githubapp.ParsePrivateKey(in)
			if githubapp.CodeOf(err) != githubapp.InvalidKey {
				t.Fatalf("err = %v, want invalid_key", err)
			}
			if in != "" && len(in) > 20 && strings.Contains(err.Error(), in[len(in)/2:len(in)/2+10]) {
				t.Fatal("the error quotes the key")
			}
		})
	}
}

func TestAppJWT(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	signed, err := githubapp.AppJWT(testAppID, testKey(), now)
	if err != nil {
		t.Fatal(err)
	}
	var claims jwt.RegisteredClaims
	tok, err := jwt.ParseWithClaims(signed, &claims, func(*jwt.Token) (any, error) { return &testKey().PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithTimeFunc(func() time.Time { return now }))
	if err != nil || !tok.Valid {
		t.Fatalf("verify with the public key: %v", err)
	}
	if claims.Issuer != testAppID {
		t.Errorf("iss = %q, want %q", claims.Issuer, testAppID)
	}
	if got := now.Sub(claims.IssuedAt.Time); got != 60*time.Second {
		t.Errorf("iat is %s in the past, want 60s", got)
	}
	if got := claims.ExpiresAt.Sub(now); got <= 0 || got > 10*time.Minute {
		t.Errorf("exp is %s ahead, want within 10 minutes", got)
	}
	if got := claims.ExpiresAt.Sub(claims.IssuedAt.Time); got > 10*time.Minute {
		t.Errorf("exp - iat = %s, GitHub allows 10 minutes", got)
	}
	other := must(rsaKey())
	if _, err := jwt.Parse(signed, func(*jwt.Token) (any, error) { return &other.PublicKey, nil }, jwt.WithTimeFunc(func() time.Time { return now })); err == nil {
		t.Error("the JWT verifies under another key")
	}
}

// rsaKey is a key other than testKey (small: it only has to differ).
func rsaKey() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 1024) }

func wrap(s string, n int) string {
	var b strings.Builder
	for len(s) > n {
		b.WriteString(s[:n] + "\n")
		s = s[n:]
	}
	return b.String() + s
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
