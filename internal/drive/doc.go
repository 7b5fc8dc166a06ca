// Package drive is the Google Drive provider: a connection kind written
// in Go for what the generic MCP and OpenAPI clients cannot express
// (multipart uploads, alt=media downloads, path → id lookups). An entry
// `connections.<name>.drive: {rootFolderId?, apiBaseUrl?, uploadBaseUrl?}`
// with an auth becomes a connection with eight operations, whose model
// tool ids are <name>_<tool> (connect.ToolIDs), checked, gated and
// reported like every other connection's:
//
//	list_files    files.list: q (Drive query syntax) and/or folderId;
//	              neither lists the root folder; pageSize, pageToken, orderBy
//	find_file     path A/B/file.txt → {found, file}
//	read_file     fileId or path → {file, content, encoding, exportedAs?}
//	create_file   content under folderId or folderPath (multipart upload)
//	update_file   new content for fileId (media upload)
//	save_file     upsert by path, missing folders created → {created, file}
//	create_folder under parentId or parentPath
//	delete_file   permanent delete by fileId or path
//
// list, find and read declare readOnlyHint; delete declares
// destructiveHint; every hint is declared, true or false.
//
// # Choices
//
//   - The reference's `name` option (a tool prefix, so two Drives can sit
//     on one agent) is the connection's name here: tools are already
//     <connection>_<tool>, so two entries (`work:`, `personal:`) are two
//     Drives, and there is no separate option.
//   - Paths resolve from rootFolderId (default "root", My Drive), one
//     files.list per segment: `'<parent>' in parents and name = '<name>'
//     and trashed = false` (folders only for all but the last), with ' and
//     \ escaped by a backslash as Drive's query syntax says. The answer is
//     filtered to exact name matches and read to the end (Drive may split
//     it over pages). Two matches fail the call, naming both ids: acting
//     on one of them would act on a file nobody chose. Empty segments are
//     ignored; "." and ".." are refused.
//   - rootFolderId confines paths and the default listing, not q: a query
//     reaches whatever the credential can see. The credential's own reach
//     (drive.file scope, a service account that was given one folder) is
//     the boundary.
//   - Google Docs and Slides are exported as text/plain and Sheets as
//     text/csv (Drive exports a sheet's first tab); other Workspace types
//     (forms, drawings, shortcuts) and folders are refused. Other files
//     are downloaded with alt=media; content that is not UTF-8 comes back
//     base64. Reads and writes are bounded by maxFileBytes (default 5 MiB,
//     Google's bound for a single-request upload), checked against the
//     file's size before it is fetched, so only multipart (create) and
//     media (update) uploads are sent, never resumable ones.
//   - Every request sets supportsAllDrives=true (and listings
//     includeItemsFromAllDrives=true): a service account's files usually
//     live in a Shared Drive, which Drive hides without them.
//   - Google's errors ({"error": {"code", "message", "errors": [{reason}]}})
//     become a *connect.CallError "HTTP 404 notFound: File not found: …",
//     which the model sees; an ambiguous or missing path is one too.
//
// # Credentials, per call
//
// A call that carries credentials (connect.CallRequest.Headers, resolved
// at gate 6 by the OAuth sign-in service for its principal) is sent with
// exactly those: alice's call carries alice's token. A 401 on them wraps
// connect.ErrNeedsSignIn, so the harness refreshes once and sends again.
// A call without them acts as the service account, when the entry has
// one: the JSON key is resolved from the secret store at every call (a
// rotated key takes effect at once), parsed, and exchanged with the
// JWT-bearer grant at the key's token_uri (https, or http on loopback for
// tests) by golang.org/x/oauth2/jwt, which reuses the token until 10 s
// before it expires (each replica keeps its own, so about one exchange
// per replica per hour); a 401 drops it and the call is sent once more
// with a new one. An exchange is bounded by 30 s. A call with neither is refused before anything is sent. The
// key, its private key and every access token are given to the redactor
// before use, and no error quotes them. A refused exchange says what the
// token endpoint said ("invalid_grant: Invalid JWT Signature.", read
// from the body x/oauth2/jwt keeps; see credhttp.RefusalOf).
//
// Either credential goes to Drive's origin only: requests follow
// redirects as the entry's followRedirects says, under package
// credhttp's rules (same-origin GET and HEAD by default; with any, other
// origins without the token), and the token request follows none off the
// token_uri's origin.
//
// # Why not google.golang.org/api/drive/v3
//
// The issue asked for the official client or a reason not to use it. It
// was measured in a throwaway module (a main calling drive.NewService),
// v0.316.0, fresh GOCACHE and module cache, on this 2-core machine
// (load average about 8 from other builds, so absolute times are high
// for both):
//
//	                        official drive/v3   net/http + x/oauth2/jwt
//	cold go build           123.7 s             41.8 s
//	packages linked         435                 192
//	modules in the graph    68                  3
//	modules linked          27                  2
//	binary                  22.2 MB             9.3 MB
//	new to patchbay         170 packages        2 packages (x/oauth2/jws, jwt)
//	                        12 modules (grpc,   0 modules
//	                        otel contrib,
//	                        s2a-go, gax-go, …)
//
// Its generated client (a 400 KB file) and its transport stack (gRPC,
// OpenTelemetry instrumentation, S2A, enterprise certificates) would add
// about 170 packages to every cold `make run` for eight REST calls. The
// endpoints used here are few and documented (files.list, files.get with
// and without alt=media, files.export, files.create on the metadata and
// upload URIs, files.update with uploadType=media, files.delete), so this
// package speaks them with net/http, and the service account's grant
// with golang.org/x/oauth2/jwt (the x/oauth2 module is already a
// dependency; x/oauth2/google would add cloud.google.com/go/compute).
package drive
