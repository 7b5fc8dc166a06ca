// Package githubapp mints GitHub App installation tokens: short-lived
// credentials scoped to one repository and to the permissions one call
// needs, instead of a personal access token. A Source holds one App (its
// id and private key) on one GitHub (github.com, or a GitHub Enterprise
// Server through APIBaseURL, https://<host>/api/v3). Connections use it as
// a credential source; server-side code calls Token, Do or Transport.
//
// # Minting
//
// Token(ctx, Scope{Owner, Repo, Permissions}):
//
//  1. The scope is checked: owner and repo must be GitHub names (they go
//     into URL paths), and Permissions is required — an exchange without
//     it would carry every permission the installation has. Levels are
//     read, write or admin. metadata: read is added unless named: GitHub
//     grants it to every App with repository access anyway.
//  2. An RS256 App JWT is signed (golang-jwt): iss the App id, iat 60
//     seconds in the past for clock drift, exp 9 minutes ahead (GitHub
//     allows at most 10).
//  3. GET /repos/{owner}/{repo}/installation finds the installation.
//  4. POST /app/installations/{id}/access_tokens with
//     {"repositories": [repo], "permissions": …} narrows the token.
//  5. The grant is checked and fails closed: a permission missing or
//     granted at a lower level than asked, or repositories other than the
//     one asked, is permission_denied, and the token is not used.
//
// Every error is an *Error with the reference's Code: not_installed (404
// on the lookup, or a 422 about the repository), permission_denied (403,
// a 422 about permissions, or a short grant), unauthorized (401: the JWT —
// app id, key or clock), rate_limited (429, or 403 with
// x-ratelimit-remaining: 0, retry-after or a rate-limit message; RetryAfter
// from retry-after, else from x-ratelimit-reset, else 0 when GitHub did
// not say), network (no response; the cause is wrapped), invalid_key,
// invalid_request, and http for anything else, a success without a token
// included. A Message quotes what GitHub said (its message and first
// error, or an OAuth-shaped code and description; see
// credhttp.ParseRefusal). Redis failures are plain wrapped errors.
//
// # The cache
//
// Tokens live in Redis, shared by every replica on the Store, under
// ghapp:token:{<id>} where <id> is a digest of the API base URL, the App
// id, the owner and repo (lower-cased: GitHub ignores their case) and the
// sorted permissions after metadata: read is added — so {issues: write}
// and {issues: write, metadata: read} share a token, and two Apps or two
// GitHubs never do. A value is the token and its expiry, sealed with
// package seal (AES-256-GCM under a key HKDF-derived from
// PATCHBAY_SECRET_KEY for this package alone, bound to its key name, like
// OAuth tokens); its Redis TTL ends RefreshBefore (5 minutes) ahead of the
// token's expiry, and a read also checks that margin against the clock.
//
// One exchange per scope per cluster: within a process callers share a
// singleflight; across processes the flight first takes ghapp:lock:{<id>}
// (SET NX with a random owner value, 20 s TTL, released only by its
// owner). The winner exchanges and leaves the token in the cache, or its
// *Error under ghapp:failed:{<id>}:<owner> (20 s), then releases the lock
// and publishes on ghapp:done:{<id>}. The others wait for the owner they
// saw: subscribed, they check whether that lock is gone or replaced (then
// they return the cached token or that flight's error — they do not ask
// GitHub again — or, when it left neither, take the lock themselves),
// waking on the publication and every 250 ms, so a holder that died
// costs at most the lock's TTL. A flight is bounded by the lock TTL and
// survives a caller that gives up.
//
// A token GitHub answers 401 to before its expiry (revoked, App
// uninstalled) is dropped with Invalidate(scope, rejected) — only while
// the cache still holds that token, so a replica never drops the fresh one
// another replica has just minted. Do(scope, fn) and Transport do this and
// retry once; Refresh does it for a caller that sends its own requests
// with Headers (the harness's Credentials and CredentialRefresher).
//
// # Where a token may go
//
// The private key is given to Options.Redactor by New, and every
// installation token and App JWT as soon as it is minted or read from the
// cache; the package logs nothing,
// and its errors never quote a token, a JWT or the key.
//
// A token goes only to GitHub, from patchbay's own process: an
// Authorization header on a call a connection sends, or a clone or push a
// server-side action makes. Never hand it to anything the model controls —
// a sandbox shell, an environment variable a tool can print, a git remote
// URL or credential helper inside a sandbox, a tool argument or result:
// code running there can read it from the environment, a git hook or a
// replaced binary, and the model can repeat it. Give the sandbox the
// working tree, not the credential. Transport sends the token to one
// origin only (the API's, or the one it is given), so a redirect elsewhere
// never carries it; the lookup and the exchange follow a redirect only
// within the API's origin and never for the exchange's POST
// (credhttp.FollowSameOrigin), so the App JWT stays there too.
//
// Least privilege is the caller's policy: ask for contents: read to clone
// and for write only when a human has approved it. A per-caller scope
// (each principal's own org) belongs behind requiresPrincipal, and the
// scope used with no principal (discovery) should be the narrowest that
// lists tools.
package githubapp
