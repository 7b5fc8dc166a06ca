package credhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

const assertion = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJyb2JvdCJ9.c2lnbmF0dXJlLWJ5dGVz"

// TestParseRefusal: the code and description of every common shape of
// error body, on one line, clipped, without JWT-shaped strings.
func TestParseRefusal(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 400)
	tests := []struct {
		name, contentType, body string
		want                    string
	}{
		{"oauth json", "application/json", `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`, "invalid_grant: Invalid JWT Signature."},
		{"oauth json as text/plain", "text/plain", `{"error":"invalid_grant","error_description":"Token has been expired or revoked."}`, "invalid_grant: Token has been expired or revoked."},
		{"oauth form", "application/x-www-form-urlencoded", `error=invalid_client&error_description=Unknown+client`, "invalid_client: Unknown client"},
		{"code only", "application/json", `{"error":"unauthorized_client"}`, "unauthorized_client"},
		{"google api", "application/json", `{"error":{"code":403,"message":"The caller does not have permission","status":"PERMISSION_DENIED"}}`, "PERMISSION_DENIED: The caller does not have permission"},
		{"google api reason", "application/json", `{"error":{"code":400,"message":"Bad key","errors":[{"reason":"keyInvalid"}]}}`, "keyInvalid: Bad key"},
		{"github", "application/json", `{"message":"A JSON web token could not be decoded","documentation_url":"https://docs.github.com/rest"}`, "A JSON web token could not be decoded"},
		{"github errors", "application/json", `{"message":"Validation Failed","errors":[{"resource":"Installation","code":"invalid","field":"repositories","message":"no such repository"}]}`, "invalid: Validation Failed (no such repository)"},
		{"text", "text/plain", "Bad\r\nclient\x00 id", "Bad client id"},
		{"html", "text/html", "<html><body>Error 500</body></html>", "HTTP 400 Bad Request"},
		{"empty", "", "", "HTTP 400 Bad Request"},
		{"echoed assertion", "application/json", `{"error":"invalid_grant","error_description":"bad assertion ` + assertion + `"}`, "invalid_grant: bad assertion <redacted>"},
		{"echoed key", "application/json", `{"message":"key -----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----\n is not this App's"}`, "key <redacted> is not this App's"},
		{"long", "application/json", `{"error":"invalid_request","error_description":"` + long + `"}`, "invalid_request: " + long[:300] + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := credhttp.ParseRefusal(http.StatusBadRequest, tt.contentType, []byte(tt.body)).String(); got != tt.want {
				t.Fatalf("got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestDescribeTokenError: what x/oauth2 returns, in whichever shape,
// becomes the endpoint's code and description — including the
// *oauth2.RetrieveError with only its body filled in (x/oauth2/jwt's) and
// a JSON body sent as text/plain, which x/oauth2 reads as a form.
func TestDescribeTokenError(t *testing.T) {
	t.Parallel()
	const body = `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.URL.Query().Get("type"))
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(ts.Close)
	for _, ct := range []string{"application/json", "text/plain"} {
		conf := oauth2.Config{ClientID: "c", Endpoint: oauth2.Endpoint{TokenURL: ts.URL + "/token?type=" + ct}}
		_, err := conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: "r"}).Token()
		if got := credhttp.DescribeTokenError(err); got != "invalid_grant: Invalid JWT Signature." {
			t.Errorf("%s: %q (from %v)", ct, got, err)
		}
	}
	bodyOnly := &oauth2.RetrieveError{Response: &http.Response{StatusCode: 400, Header: http.Header{"Content-Type": {"application/json"}}}, Body: []byte(body)}
	if got := credhttp.DescribeTokenError(fmt.Errorf("wrapped: %w", bodyOnly)); got != "invalid_grant: Invalid JWT Signature." {
		t.Errorf("body only: %q", got)
	}
	r, ok := credhttp.RefusalOf(bodyOnly)
	if !ok || r.Code != "invalid_grant" || r.Status != 400 {
		t.Errorf("RefusalOf = %+v, %v", r, ok)
	}
	if _, ok := credhttp.RefusalOf(errors.New("dial tcp: refused")); ok {
		t.Error("a transport failure read as a refusal")
	}
	if got := credhttp.DescribeTokenError(errors.New("dial tcp 127.0.0.1:1: connection refused")); got != "dial tcp 127.0.0.1:1: connection refused" {
		t.Errorf("transport: %q", got)
	}
}
