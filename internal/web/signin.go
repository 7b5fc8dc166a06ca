package web

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/oauth"
)

// SignIns is what the UI needs of the OAuth sign-in service
// (internal/oauth): start a sign-in bound to this browser session, finish
// it at the callback, show who is signed in, and disconnect; and the
// Client ID Metadata Document authorization servers fetch to learn who
// patchbay is.
type SignIns interface {
	Begin(ctx context.Context, connection, principal, sessionID string) (authURL string, err error)
	Complete(ctx context.Context, sessionID string, query url.Values) (connection, principal string, err error)
	Account(ctx context.Context, connection, principal string) (oauth.Account, error)
	Disconnect(ctx context.Context, connection, principal string) error
	ClientMetadata() []byte
}

// clientMetadata serves the Client ID Metadata Document at
// oauth.ClientMetadataPath. It is public: authorization servers fetch it
// with no session, and it holds no secret.
func (h *handler) clientMetadata(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=3600")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, h.SignIns.ClientMetadata())
}

// operatorPrincipal is whom a shared sign-in is kept for.
const operatorPrincipal = authz.OperatorName

// signInTarget is the connection the path names and whom this session
// signs in for there: a shared connection is signed in to by operators for
// everyone, a per-user one by each person for themselves.
func (h *handler) signInTarget(c echo.Context) (*registry.Connection, string, error) {
	conn, err := h.Registry.Get(c.Param("name"))
	if err != nil {
		return nil, "", &notFound{"No connection is named " + c.Param("name") + "."}
	}
	kind := conn.Access().SignIn
	if kind == "" {
		return nil, "", &notFound{"Connection " + conn.Name() + " is not signed in to with OAuth."}
	}
	principal := signInPrincipal(kind, sessionOf(c))
	if principal == "" {
		return nil, "", &refused{"Only an operator signs in to " + conn.Name() + ": it uses one shared account."}
	}
	return conn, principal, nil
}

// signInPrincipal is whom sess signs in for on a connection of this
// sign-in kind: each person for themselves on a per-user one, operators
// for everyone on a shared one; "" when sess may not.
func signInPrincipal(kind string, sess *Session) string {
	switch {
	case kind == registry.SignInPerUser:
		return sess.Subject
	case kind == registry.SignInShared && sess.Operator():
		return operatorPrincipal
	}
	return ""
}

// startSignIn sends the browser to the connection's authorization server.
func (h *handler) startSignIn(c echo.Context) error {
	conn, principal, err := h.signInTarget(c)
	if err != nil {
		return err
	}
	id, _ := c.Get(sessionIDKey).(string)
	authURL, err := h.SignIns.Begin(bg(c), conn.Name(), principal, id)
	if err != nil {
		return h.signInFailed(c, conn.Name(), err)
	}
	return c.Redirect(http.StatusSeeOther, authURL)
}

// finishSignIn is the redirect URI: it checks the answer against the
// session that started the sign-in and stores the tokens.
func (h *handler) finishSignIn(c echo.Context) error {
	id, _ := c.Get(sessionIDKey).(string)
	name, _, err := h.SignIns.Complete(bg(c), id, c.QueryParams())
	if err != nil {
		return h.signInFailed(c, name, err)
	}
	h.reconnect(c, name)
	h.Logger.Info("oauth sign-in completed", "connection", name, "subject", sessionOf(c).Subject)
	return c.Redirect(http.StatusSeeOther, "/admin/connections/"+url.PathEscape(name)+"?flash=signed-in")
}

// reconnect makes the connection try again with the new sign-in and waits
// a little for it, so the page the browser lands on shows it ready.
func (h *handler) reconnect(c echo.Context, name string) {
	conn, err := h.Registry.Get(name)
	if err != nil {
		h.Logger.Warn("sign-in completed for a connection the registry does not hold", "connection", name)
		return
	}
	if conn.Status().State == connect.StateReady {
		return
	}
	_ = h.Registry.Kick(name)
	deadline := time.Now().Add(readyWait)
	for conn.Status().State != connect.StateReady && time.Now().Before(deadline) {
		select {
		case <-bg(c).Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// readyWait bounds how long the callback waits for the connection.
const readyWait = 5 * time.Second

// disconnect revokes and deletes this session's sign-in.
func (h *handler) disconnect(c echo.Context) error {
	conn, principal, err := h.signInTarget(c)
	if err != nil {
		return err
	}
	if err := h.SignIns.Disconnect(bg(c), conn.Name(), principal); err != nil {
		return err
	}
	h.Logger.Info("oauth sign-in disconnected", "connection", conn.Name(), "subject", sessionOf(c).Subject)
	return c.Redirect(http.StatusSeeOther, "/admin/connections/"+url.PathEscape(conn.Name())+"?flash=signed-out")
}

// signInFailed renders a failed sign-in as a page that says what
// happened and what to do; only a fault of patchbay itself is a 500.
func (h *handler) signInFailed(c echo.Context, connection string, err error) error {
	var fe *oauth.FlowError
	if !errors.As(err, &fe) {
		return err
	}
	h.Logger.Warn("oauth sign-in failed", "connection", connection, "kind", fe.Kind, "err", fe.Message)
	back := "/admin"
	if connection != "" {
		back = "/admin/connections/" + url.PathEscape(connection)
	}
	status := http.StatusBadRequest
	if fe.Kind == "discovery" || fe.Kind == "registration" || fe.Kind == "exchange" {
		status = http.StatusBadGateway
	}
	return h.render(c, status, signInFailedPage(h.page(c, "Sign-in failed", "overview"), fe.Kind, fe.Message, templ.SafeURL(back)))
}

// signInPanel is what the connection page shows about its sign-in.
type signInPanel struct {
	Kind      string // registry.SignInShared or SignInPerUser
	Principal string // whom this session would sign in for ("" when it may not)
	Account   *oauth.Account
	Start     string
}

func (h *handler) signInPanel(c echo.Context, conn *registry.Connection) *signInPanel {
	kind := conn.Access().SignIn
	if h.SignIns == nil || kind == "" {
		return nil
	}
	p := &signInPanel{Kind: kind, Start: "/oauth/" + url.PathEscape(conn.Name()) + "/start"}
	p.Principal = signInPrincipal(kind, sessionOf(c))
	who := p.Principal
	if who == "" {
		who = operatorPrincipal
	}
	if a, err := h.SignIns.Account(bg(c), conn.Name(), who); err == nil {
		p.Account = &a
	}
	return p
}
