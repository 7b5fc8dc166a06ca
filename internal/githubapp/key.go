package githubapp

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"strings"
)

// ParsePrivateKey reads the App's RSA private key as people end up holding
// it: PEM in PKCS#1 ("BEGIN RSA PRIVATE KEY", what GitHub hands out) or
// PKCS#8 ("BEGIN PRIVATE KEY"), with literal \n escapes (an env var or a
// JSON string), CRLF line ends, surrounding quotes, or the whole PEM
// base64-encoded once more (to fit a one-line secret). Anything else is an
// invalid_key Error, whose message never quotes the value.
func ParsePrivateKey(s string) (*rsa.PrivateKey, error) {
	s = unwrap(s)
	if !strings.Contains(s, "-----BEGIN") {
		decoded, err := decodeBase64(s)
		if err != nil {
			return nil, errorf(InvalidKey, "the private key is neither PEM nor base64-wrapped PEM")
		}
		s = unwrap(string(decoded))
	}
	kind, der, ok := pemBody(s)
	if !ok {
		return nil, errorf(InvalidKey, "the private key is not a readable PEM block")
	}
	switch kind {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(der)
		if err != nil {
			return nil, errorf(InvalidKey, "the PKCS#1 private key does not parse")
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(der)
		if err != nil {
			return nil, errorf(InvalidKey, "the PKCS#8 private key does not parse")
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, errorf(InvalidKey, "the private key is not an RSA key (GitHub Apps sign with RS256)")
		}
		return rk, nil
	}
	return nil, errorf(InvalidKey, "a PEM block of type %q is not a private key GitHub issues (RSA PRIVATE KEY or PRIVATE KEY)", kind)
}

// unwrap undoes what a trip through env files and JSON does to a key:
// surrounding whitespace and quotes, literal \n and \r escapes, CRLF.
func unwrap(s string) string {
	s = strings.TrimSpace(s)
	for len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	s = strings.NewReplacer(`\r`, "", `\n`, "\n", "\r", "").Replace(s)
	return s
}

func decodeBase64(s string) ([]byte, error) {
	s = strings.Join(strings.Fields(s), "")
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}

// pemBody finds the first PEM block and decodes its body, ignoring how its
// lines were broken (some secret stores fold a PEM onto one line with
// spaces). Encrypted PEM (headers in the body) does not decode.
func pemBody(s string) (kind string, der []byte, ok bool) {
	const begin, dashes = "-----BEGIN ", "-----"
	i := strings.Index(s, begin)
	if i < 0 {
		return "", nil, false
	}
	rest := s[i+len(begin):]
	j := strings.Index(rest, dashes)
	if j < 0 {
		return "", nil, false
	}
	kind, rest = rest[:j], rest[j+len(dashes):]
	end := strings.Index(rest, "-----END "+kind+dashes)
	if end < 0 {
		return "", nil, false
	}
	der, err := decodeBase64(rest[:end])
	if err != nil || len(der) == 0 {
		return "", nil, false
	}
	return kind, der, true
}
