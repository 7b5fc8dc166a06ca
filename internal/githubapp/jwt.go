package githubapp

import (
	"crypto/rsa"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// The App JWT's validity window, as GitHub documents it: iat 60 seconds in
// the past to absorb clock drift, exp at most 10 minutes after now.
const (
	jwtBackdate = 60 * time.Second
	jwtLifetime = 9 * time.Minute
)

// AppJWT signs the RS256 JWT that authenticates as the App itself (not an
// installation): iss is the App's id (or client id), iat a minute in the
// past, exp nine minutes ahead, so exp - iat is GitHub's ten-minute limit.
func AppJWT(appID string, key *rsa.PrivateKey, now time.Time) (string, error) {
	claims := jwt.RegisteredClaims{
		Issuer:    appID,
		IssuedAt:  jwt.NewNumericDate(now.Add(-jwtBackdate)),
		ExpiresAt: jwt.NewNumericDate(now.Add(jwtLifetime)),
	}
	signed, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(key)
	if err != nil {
		return "", errorf(InvalidKey, "sign the App JWT: %v", err)
	}
	return signed, nil
}
