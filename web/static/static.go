// Package static holds the admin UI's stylesheet and vendored scripts,
// embedded into the binary so the UI needs no CDN.
//
// htmx.min.js is htmx.org 2.0.11 and htmx-ext-sse.min.js is htmx-ext-sse
// 2.2.4, both copied from the npm registry's packages (dist/); their
// licence is htmx.LICENSE (0BSD).
package static

import "embed"

// FS is the stylesheet and the scripts, served under /admin/static/.
//
//go:embed *.css *.js
var FS embed.FS
