package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// requireAPIKey admits requests bearing one of keys (SHA-256 digests). Every
// digest is compared in constant time, and all of them are always compared,
// so timing says nothing about which key came close.
func requireAPIKey(keys [][32]byte) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			token, ok := bearer(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				return problem(http.StatusUnauthorized, codeUnauthenticated, "an API key is required: Authorization: Bearer <key>")
			}
			sum := sha256.Sum256([]byte(token))
			match := 0
			for _, k := range keys {
				match |= subtle.ConstantTimeCompare(sum[:], k[:])
			}
			if match != 1 {
				return problem(http.StatusUnauthorized, codeUnauthenticated, "the API key is not valid")
			}
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
