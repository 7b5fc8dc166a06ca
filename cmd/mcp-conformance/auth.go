package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// Headless sign-in for the suite's auth scenarios.
const (
	// conformanceCIMD is the client_id the suite's Client ID Metadata
	// Document scenarios expect (the document itself is never fetched).
	conformanceCIMD = "https://conformance-test.local/client-metadata.json"
	// maxSignIns bounds the sign-ins of one run, so a server that keeps
	// asking (for a scope it never grants, say) cannot loop the client.
	maxSignIns  = 3
	connName    = "conformance"
	principal   = "conformance"
	sessionID   = "conformance-session"
	signInLimit = 20 * time.Second
)

// authContext is what a scenario passes in MCP_CONFORMANCE_CONTEXT for
// pre-registered clients.
type authContext struct {
	ClientID     string `json:"client_id"`
	ClientSecret string `json:"client_secret"`
	Issuer       string `json:"issuer"`
}

// signer is an http.RoundTripper that sends requests through the OAuth
// service's Transport and, when the server wants a sign-in, signs in the
// way a person would (Begin, the authorization server's redirects, a
// loopback callback that calls Complete) and sends the request again.
type signer struct {
	svc      *oauth.Service
	next     http.RoundTripper
	browser  *http.Client
	results  chan error
	log      *slog.Logger
	mu       sync.Mutex
	signIns  int
	gen      int // bumped by each successful sign-in
	shutdown func()
}

// newSigner starts the embedded store, the OAuth service and the loopback
// callback for serverURL.
func newSigner(ctx context.Context, serverURL string, ac authContext, logger *slog.Logger) (*signer, error) {
	st, err := store.Open(ctx, "", "conformance:", slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	svc, err := oauth.New(oauth.Options{
		Store:             st,
		Key:               key,
		PublicURL:         "http://" + ln.Addr().String(),
		ClientMetadataURL: conformanceCIMD,
		Logger:            logger,
	})
	if err != nil {
		_ = ln.Close()
		_ = st.Close()
		return nil, err
	}
	svc.Register(oauth.Connection{Name: connName, ResourceURL: serverURL, ClientID: ac.ClientID, ClientSecret: ac.ClientSecret, ClientIssuer: ac.Issuer})
	s := &signer{
		svc:     svc,
		next:    svc.Transport(connName, http.DefaultTransport),
		browser: &http.Client{Timeout: signInLimit},
		results: make(chan error, 1),
		log:     logger,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+oauth.CallbackPath, func(w http.ResponseWriter, r *http.Request) {
		_, _, err := svc.Complete(r.Context(), sessionID, r.URL.Query())
		select {
		case s.results <- err:
		default:
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "signed in; you may close this window")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.shutdown = func() {
		_ = srv.Close()
		_ = st.Close()
	}
	return s, nil
}

func (s *signer) Close() { s.shutdown() }

// RoundTrip sends req; on connect.ErrNeedsSignIn it signs in and sends it
// again (a 401 means the server did not act on it).
func (s *signer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.GetBody == nil {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	for attempt := 0; ; attempt++ {
		out := req
		if attempt > 0 {
			out = req.Clone(req.Context())
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				out.Body = body
			}
		}
		gen := s.generation()
		resp, err := s.next.RoundTrip(out)
		if !errors.Is(err, connect.ErrNeedsSignIn) {
			return resp, err
		}
		s.log.Info("sign-in needed", "reason", err)
		if err := s.signIn(req.Context(), gen); err != nil {
			return nil, err
		}
	}
}

func (s *signer) generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// signIn signs in once, unless another request did since gen.
func (s *signer) signIn(ctx context.Context, gen int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return nil
	}
	if s.signIns >= maxSignIns {
		return fmt.Errorf("giving up after %d sign-ins: %w", s.signIns, connect.ErrNeedsSignIn)
	}
	s.signIns++
	ctx, cancel := context.WithTimeout(ctx, signInLimit)
	defer cancel()
	authURL, err := s.svc.Begin(ctx, connName, principal, sessionID)
	if err != nil {
		return fmt.Errorf("sign-in %d: %w", s.signIns, err)
	}
	s.log.Info("signing in", "attempt", s.signIns, "authorizationURL", authURL)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	if err != nil {
		return err
	}
	// The authorization servers under test approve at once and redirect
	// to the loopback callback; the browser client follows.
	resp, err := s.browser.Do(req)
	if err != nil {
		return fmt.Errorf("sign-in %d: authorization request: %w", s.signIns, err)
	}
	page, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	select {
	case err := <-s.results:
		if err != nil {
			return fmt.Errorf("sign-in %d: %w", s.signIns, err)
		}
	default:
		return fmt.Errorf("sign-in %d: the authorization server did not redirect to the callback (HTTP %d: %s)", s.signIns, resp.StatusCode, page)
	}
	s.gen++
	return nil
}
