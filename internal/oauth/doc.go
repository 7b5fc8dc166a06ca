// Package oauth owns patchbay's OAuth sign-in to remote MCP servers, as
// an OAuth 2.1 client following the MCP authorization specification: the
// discovery of a server's authorization server, patchbay's client identity
// there, the browser flow (Begin, then Complete from the callback), the
// encrypted token store, refresh, revocation, and the credentials handed
// to calls (Headers, which implements connect.Credentials) and to a
// connection's own session (Transport). Token exchange and refresh go
// through golang.org/x/oauth2. The web layer serves the pages
// (/oauth/{connection}/start, CallbackPath, ClientMetadataPath); this
// package has no handlers.
//
// # The flow
//
// Begin(connection, principal, browser session):
//
//  1. The challenge: the WWW-Authenticate of the server's latest 401 or
//     403, as Transport recorded it, else a probe (an unauthenticated
//     initialize POST).
//  2. Protected resource metadata (RFC 9728): the challenge's
//     resource_metadata, else /.well-known/oauth-protected-resource with
//     the server's path, else at the root. Its resource must be the
//     server's URL or a parent of it (same origin), else nothing is sent;
//     it is then sent as published, unnormalised. A server that publishes
//     none (and names none in its challenge) is taken, as the 2025-03-26
//     revision has it, to be its own authorization server at its origin,
//     whose metadata must then be found there (its endpoints are not
//     guessed: PKCE S256 could not be confirmed).
//  3. Authorization server metadata: RFC 8414 and OpenID discovery, with
//     the path-insertion forms for an issuer with a path. The document's
//     issuer must equal the issuer asked for, byte for byte; S256 must be
//     in code_challenge_methods_supported; endpoints must be https (http
//     only on loopback).
//  4. Client identity: the configured client (only at ClientIssuer, when
//     set); else the Client ID Metadata Document URL, when it is https and
//     the server sets client_id_metadata_document_supported; else dynamic
//     registration (RFC 7591), asking for client_secret_basic, then
//     client_secret_post, then none, whichever the server supports first
//     (patchbay keeps secrets, so it prefers to be a confidential client),
//     and using the method the server says it registered. Registrations
//     are cached encrypted per issuer and redirect URI, so a server change
//     means a new registration and credentials never cross servers; one
//     the server later refuses (invalid_client) is dropped.
//  5. Scopes: the configured ones plus the challenge's (after a 403
//     insufficient_scope the recorded challenge holds the union with what
//     the token had); with neither, the resource's scopes_supported;
//     offline_access added when the authorization server lists it (unless
//     nothing else is asked, which lets the server choose).
//  6. The authorization URL, with PKCE S256, state and resource (RFC
//     8707). The state (32 random bytes) keys an encrypted record in Redis
//     holding the PKCE verifier, the session's SHA-256, the connection and
//     principal, and what Complete needs; it expires after StateTTL.
//
// Complete(browser session, callback query) takes the state record out of
// Redis (GETDEL: single use, even when the rest fails), checks the
// session, then iss (RFC 9207: compared byte for byte when present,
// required when the server advertises it; checked before error, as error
// responses carry it too), then error (access_denied is KindDenied), then
// exchanges the code with the verifier and the resource. Every failure of
// Begin and Complete is a *FlowError with a message meant for the person
// at the browser.
//
// # Where tokens live
//
// One Redis string per connection and principal (oauth:token:<connection>:
// <base64url principal>), holding the access and refresh token, expiry,
// granted scopes, who signed in and when, and the token and revocation
// endpoints and client identity a refresh or revocation needs. It is JSON
// sealed with AES-256-GCM as "v1:<key id>:<base64url nonce‖ciphertext>",
// with the key name as additional data, so a value copied under another
// principal's key does not decrypt. The AES key is derived with HKDF from
// Options.Key (PATCHBAY_SECRET_KEY's current key, see KeyFromSecretKey),
// so these ciphertexts never mix with the secret store's. A per-user
// connection keeps each principal's own token; a shared one keeps one,
// under SharedPrincipal. Pending states and cached registrations are
// sealed the same way; a sorted set per connection records who signed in
// when (for Transport on per-user connections), and the latest challenge
// is kept for an hour. Every access token, refresh token and client secret
// read or written is given to Options.Redactor.
//
// # Refresh
//
// Headers and Transport refresh a token that expires within RefreshMargin.
// One caller across all replicas refreshes: it takes a Redis lock (SET NX,
// 30 s, released only by its holder), reads the token again (another may
// just have refreshed it), refreshes, stores. The others poll the token
// until it is fresh, or the lock is gone (then they try to take it). A
// refresh the server refuses (an OAuth error or a 4xx) drops the token and
// is an error wrapping connect.ErrNeedsSignIn that quotes the server's
// error code and description, read from the body when x/oauth2 left them
// empty (credhttp.RefusalOf); a refresh that fails to get
// an answer keeps the token and uses it while it is still valid. A token
// without a refresh token is used until it expires, then dropped. Token
// requests (code exchange and refresh) follow no redirect of their POST
// and none off the token endpoint's origin (credhttp.FollowSameOrigin).
//
// # Departures
//
//   - Transport sends a request without a token when nobody is signed in,
//     instead of failing at once: a server that needs no sign-in for that
//     request answers, and one that does answers 401 with the challenge
//     Begin then uses (the error wraps connect.ErrNeedsSignIn either way).
//   - A 403 insufficient_scope for scopes the token already has is
//     ErrInsufficientScope, not ErrNeedsSignIn: signing in again could not
//     help, and a caller that retries on ErrNeedsSignIn cannot loop. That
//     is the bound on step-up retries this package gives; callers that sign
//     in automatically (cmd/mcp-conformance) bound their own attempts too.
//   - A 401 on a request that carried a token forces one refresh (once
//     across replicas: a caller whose rejected token another already
//     replaced gets the new one) and the request is sent again: Transport
//     does it for the connection's own session, Refresh (a
//     connect.CredentialRefresher) for a call's credentials. When that
//     fails too the token is kept (a server hiccup must not sign everybody
//     out) and the call reports ErrNeedsSignIn; a refresh the server
//     refuses drops it.
//   - Only the current key decrypts: after PATCHBAY_SECRET_KEY rotates,
//     stored tokens and registrations read as absent (sign in again), as
//     they are short-lived; the secret store's Rekey does not cover them.
//   - A connection that names its Issuer (APIs that publish no protected
//     resource metadata, such as Google's) skips steps 1 and 2: nothing is
//     sent to the resource, and the issuer's metadata is checked as in
//     step 3. Its AuthParams are added to the authorization request
//     (Google's access_type=offline, without which it issues no refresh
//     token).
//   - No client credentials, DPoP or enterprise grants (extensions of the
//     conformance suite, not scored).
package oauth
