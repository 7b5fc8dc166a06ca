package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// Key is one accepted API key: its SHA-256 digest, the principal it names
// and the allowlist bounding what its documents may use.
type Key struct {
	SHA256    [32]byte
	Name      string
	Allowlist string
}

const principalKey = "principal"

// principal is the key a request was authenticated with.
func principal(c echo.Context) Key {
	k, _ := c.Get(principalKey).(Key)
	return k
}

// requireAPIKey admits requests bearing one of keys. Every digest is
// compared in constant time, and all of them are always compared, so timing
// says nothing about which key came close.
func requireAPIKey(keys []Key) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			token, ok := bearer(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				return problem(http.StatusUnauthorized, codeUnauthenticated, "an API key is required: Authorization: Bearer <key>")
			}
			sum := sha256.Sum256([]byte(token))
			var found Key
			match := 0
			for _, k := range keys {
				eq := subtle.ConstantTimeCompare(sum[:], k.SHA256[:])
				if eq == 1 {
					found = k
				}
				match |= eq
			}
			if match != 1 {
				return problem(http.StatusUnauthorized, codeUnauthenticated, "the API key is not valid")
			}
			c.Set(principalKey, found)
			return next(c)
		}
	}
}

func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
