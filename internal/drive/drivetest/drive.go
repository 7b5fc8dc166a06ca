// Package drivetest is a local fake of the Google Drive v3 endpoints
// the drive provider uses, and of Google's token endpoint for service
// accounts, for tests of the provider and of the server that wires it.
// Both are written from Google's documented requests and answers and
// listen on loopback only.
package drivetest

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode"
)

// Drive is a local stand-in for the Drive v3 endpoints the provider
// uses, written from Google's reference (files.list, get, create, update,
// delete and export, and the multipart and media upload protocols):
// requests are checked for the shape Google documents and answered with
// Drive's resource and error shapes. Each access token has a Drive of its
// own, so per-user calls are told apart by what they see; a request with
// an unknown token gets Drive's 401.
type Drive struct {
	t  testing.TB
	mu sync.Mutex
	// drives maps an access token to its owner's files.
	drives  map[string]*ownerFiles
	seen    []Request
	nextID  int
	srv     *httptest.Server
	pageCap int
}

// Request is one request the fake received, with the owner of the token
// it carried ("" for none or an unknown one).
type Request struct {
	Owner, Method, Path, RawQuery, Auth string
}

type ownerFiles struct {
	owner string
	files map[string]*File
}

// File is a file or folder in a fake Drive.
type File struct {
	ID, Name, MimeType string
	Parents            []string
	Content            []byte
	Trashed            bool
}

// New starts a fake Drive; tokens maps each access token it accepts to
// the owner of the Drive it opens.
func New(t testing.TB, tokens map[string]string) *Drive {
	f := &Drive{t: t, drives: map[string]*ownerFiles{}}
	for tok, owner := range tokens {
		f.drives[tok] = &ownerFiles{owner: owner, files: map[string]*File{}}
	}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

// SetPageCap makes files.list answer at most n files a page, as Drive
// may (0: pageSize).
func (f *Drive) SetPageCap(n int) {
	f.mu.Lock()
	f.pageCap = n
	f.mu.Unlock()
}

// Alias makes token open the same Drive as existing.
func (f *Drive) Alias(token, existing string) {
	f.mu.Lock()
	f.drives[token] = f.drives[existing]
	f.mu.Unlock()
}

func (f *Drive) filesOf(token string) *ownerFiles {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drives[token]
}

func (f *Drive) setFiles(token string, files *ownerFiles) {
	f.mu.Lock()
	f.drives[token] = files
	f.mu.Unlock()
}

// Revoke makes Drive refuse token from now on.
func (f *Drive) Revoke(token string) {
	f.mu.Lock()
	delete(f.drives, token)
	f.mu.Unlock()
}

// APIURL and UploadURL are the provider's apiBaseUrl and uploadBaseUrl.
func (f *Drive) APIURL() string    { return f.srv.URL + "/drive/v3" }
func (f *Drive) UploadURL() string { return f.srv.URL + "/upload/drive/v3" }

// Add puts a file in the Drive of token under parent and returns its id.
func (f *Drive) Add(token, name, mimeType, parent, content string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addLocked(f.drives[token], name, mimeType, parent, []byte(content))
}

func (f *Drive) addLocked(d *ownerFiles, name, mimeType, parent string, content []byte) string {
	f.nextID++
	id := fmt.Sprintf("id%03d", f.nextID)
	d.files[id] = &File{ID: id, Name: name, MimeType: mimeType, Parents: []string{parent}, Content: content}
	return id
}

// File is a copy of the file id in the Drive of token, or nil.
func (f *Drive) File(token, id string) *File {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := f.drives[token].files[id]
	if fl == nil {
		return nil
	}
	c := *fl
	c.Content = slices.Clone(fl.Content)
	return &c
}

// Requests are the requests received so far.
func (f *Drive) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// driveError answers in Google's error shape.
func driveError(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": msg,
		"errors": []map[string]any{{"domain": "global", "reason": reason, "message": msg}},
	}})
}

func (f *Drive) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	auth := r.Header.Get("Authorization")
	d := f.drives[strings.TrimPrefix(auth, "Bearer ")]
	owner := ""
	if d != nil {
		owner = d.owner
	}
	f.seen = append(f.seen, Request{Owner: owner, Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Auth: auth})
	if d == nil || !strings.HasPrefix(auth, "Bearer ") {
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/"`)
		driveError(w, 401, "authError", "Request had invalid authentication credentials.")
		return
	}
	if r.URL.Query().Get("supportsAllDrives") != "true" {
		f.t.Errorf("%s %s without supportsAllDrives=true", r.Method, r.URL.Path)
	}
	path := r.URL.Path
	switch {
	case r.Method == "GET" && path == "/drive/v3/files":
		f.list(w, r, d)
	case r.Method == "POST" && path == "/drive/v3/files":
		f.createMetadata(w, r, d)
	case r.Method == "POST" && path == "/upload/drive/v3/files":
		f.createUpload(w, r, d)
	case strings.HasPrefix(path, "/drive/v3/files/") && strings.HasSuffix(path, "/export") && r.Method == "GET":
		f.export(w, r, d, strings.TrimSuffix(strings.TrimPrefix(path, "/drive/v3/files/"), "/export"))
	case strings.HasPrefix(path, "/drive/v3/files/") && r.Method == "GET":
		f.get(w, r, d, strings.TrimPrefix(path, "/drive/v3/files/"))
	case strings.HasPrefix(path, "/drive/v3/files/") && r.Method == "DELETE":
		id := strings.TrimPrefix(path, "/drive/v3/files/")
		if d.files[id] == nil {
			driveError(w, 404, "notFound", "File not found: "+id+".")
			return
		}
		f.deleteTree(d, id)
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(path, "/upload/drive/v3/files/") && r.Method == "PATCH":
		f.updateMedia(w, r, d, strings.TrimPrefix(path, "/upload/drive/v3/files/"))
	default:
		driveError(w, 404, "notFound", "Not Found")
	}
}

func (f *Drive) deleteTree(d *ownerFiles, id string) {
	delete(d.files, id)
	for cid, c := range d.files {
		if slices.Contains(c.Parents, id) {
			f.deleteTree(d, cid)
		}
	}
}

// resource is a file as Drive answers it (all the fields the provider
// asks for; size only for files with binary content).
func resource(fl *File) map[string]any {
	m := map[string]any{
		"kind": "drive#file", "id": fl.ID, "name": fl.Name, "mimeType": fl.MimeType, "parents": fl.Parents,
		"modifiedTime": "2026-12-01T10:00:00.000Z", "webViewLink": "https://drive.google.com/file/d/" + fl.ID + "/view",
	}
	if !strings.HasPrefix(fl.MimeType, "application/vnd.google-apps.") {
		m["size"] = strconv.Itoa(len(fl.Content))
	}
	return m
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	json.NewEncoder(w).Encode(v)
}

func (f *Drive) list(w http.ResponseWriter, r *http.Request, d *ownerFiles) {
	q := r.URL.Query()
	if !strings.HasPrefix(q.Get("fields"), "nextPageToken,incompleteSearch,files(") {
		f.t.Errorf("files.list fields = %q", q.Get("fields"))
	}
	match, err := parseQuery(q.Get("q"))
	if err != nil {
		driveError(w, 400, "invalid", "Invalid Value")
		return
	}
	var all []*File
	for _, fl := range d.files {
		if match(fl) {
			all = append(all, fl)
		}
	}
	slices.SortFunc(all, func(a, b *File) int { return strings.Compare(a.ID, b.ID) })
	size := 100
	if s := q.Get("pageSize"); s != "" {
		size, _ = strconv.Atoi(s)
	}
	if f.pageCap > 0 {
		size = min(size, f.pageCap)
	}
	start, _ := strconv.Atoi(q.Get("pageToken"))
	end := min(len(all), start+size)
	files := []map[string]any{}
	for _, fl := range all[start:end] {
		files = append(files, resource(fl))
	}
	out := map[string]any{"kind": "drive#fileList", "incompleteSearch": false, "files": files}
	if end < len(all) {
		out["nextPageToken"] = strconv.Itoa(end)
	}
	writeJSON(w, out)
}

func (f *Drive) get(w http.ResponseWriter, r *http.Request, d *ownerFiles, id string) {
	fl := d.files[id]
	if fl == nil {
		driveError(w, 404, "notFound", "File not found: "+id+".")
		return
	}
	if r.URL.Query().Get("alt") != "media" {
		writeJSON(w, resource(fl))
		return
	}
	if strings.HasPrefix(fl.MimeType, "application/vnd.google-apps.") {
		driveError(w, 403, "fileNotDownloadable", "Only files with binary content can be downloaded. Use Export with Docs Editors files.")
		return
	}
	w.Header().Set("Content-Type", fl.MimeType)
	w.Write(fl.Content)
}

// exportable is what each Workspace type may be exported as (a subset of
// Google's table).
var exportable = map[string][]string{
	"application/vnd.google-apps.document":     {"text/plain", "text/html", "application/pdf"},
	"application/vnd.google-apps.spreadsheet":  {"text/csv", "application/pdf"},
	"application/vnd.google-apps.presentation": {"text/plain", "application/pdf"},
}

func (f *Drive) export(w http.ResponseWriter, r *http.Request, d *ownerFiles, id string) {
	fl := d.files[id]
	if fl == nil {
		driveError(w, 404, "notFound", "File not found: "+id+".")
		return
	}
	want := r.URL.Query().Get("mimeType")
	if !slices.Contains(exportable[fl.MimeType], want) {
		driveError(w, 400, "badRequest", "The requested conversion is not supported.")
		return
	}
	w.Header().Set("Content-Type", want)
	w.Write(fl.Content)
}

func (f *Drive) checkParents(w http.ResponseWriter, d *ownerFiles, parents []string) bool {
	if len(parents) != 1 {
		driveError(w, 400, "badRequest", "exactly one parent expected")
		return false
	}
	if p := parents[0]; p != "root" && (d.files[p] == nil || d.files[p].MimeType != "application/vnd.google-apps.folder") {
		driveError(w, 404, "notFound", "File not found: "+p+".")
		return false
	}
	return true
}

type fakeMeta struct {
	Name     string   `json:"name"`
	MimeType string   `json:"mimeType"`
	Parents  []string `json:"parents"`
}

// createMetadata is files.create without content (a folder).
func (f *Drive) createMetadata(w http.ResponseWriter, r *http.Request, d *ownerFiles) {
	var m fakeMeta
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" || json.NewDecoder(r.Body).Decode(&m) != nil {
		driveError(w, 400, "parseError", "Parse Error")
		return
	}
	if !f.checkParents(w, d, m.Parents) {
		return
	}
	id := f.addLocked(d, m.Name, m.MimeType, m.Parents[0], nil)
	writeJSON(w, resource(d.files[id]))
}

// createUpload is files.create on the upload URI. Only uploadType
// multipart is served: a multipart/related body whose first part is the
// metadata (application/json) and whose second is the media, as Google's
// "Perform a multipart upload" describes.
func (f *Drive) createUpload(w http.ResponseWriter, r *http.Request, d *ownerFiles) {
	if ut := r.URL.Query().Get("uploadType"); ut != "multipart" {
		driveError(w, 400, "badRequest", "uploadType "+ut+" is not served by this fake")
		return
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/related" || params["boundary"] == "" {
		driveError(w, 400, "badContent", "Media type '"+mt+"' is not supported.")
		return
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	part, err := mr.NextPart()
	if err != nil {
		driveError(w, 400, "badContent", "no metadata part")
		return
	}
	var m fakeMeta
	if pt, _, _ := mime.ParseMediaType(part.Header.Get("Content-Type")); pt != "application/json" || json.NewDecoder(part).Decode(&m) != nil {
		driveError(w, 400, "badContent", "the first part must be the JSON metadata")
		return
	}
	media, err := mr.NextPart()
	if err != nil {
		driveError(w, 400, "badContent", "no media part")
		return
	}
	content, _ := io.ReadAll(media)
	if _, err := mr.NextPart(); err != io.EOF {
		driveError(w, 400, "badContent", "more than two parts")
		return
	}
	if !f.checkParents(w, d, m.Parents) {
		return
	}
	mimeType := m.MimeType
	if mimeType == "" {
		mimeType = media.Header.Get("Content-Type")
	}
	id := f.addLocked(d, m.Name, mimeType, m.Parents[0], content)
	writeJSON(w, resource(d.files[id]))
}

// updateMedia is files.update with uploadType=media: the body is the new
// content, as Google's "Perform a simple upload" describes.
func (f *Drive) updateMedia(w http.ResponseWriter, r *http.Request, d *ownerFiles, id string) {
	if ut := r.URL.Query().Get("uploadType"); ut != "media" {
		driveError(w, 400, "badRequest", "uploadType "+ut+" is not served by this fake for updates")
		return
	}
	fl := d.files[id]
	if fl == nil {
		driveError(w, 404, "notFound", "File not found: "+id+".")
		return
	}
	if r.Header.Get("Content-Type") == "" {
		driveError(w, 400, "badContent", "no Content-Type")
		return
	}
	fl.Content, _ = io.ReadAll(r.Body)
	writeJSON(w, resource(fl))
}

// parseQuery compiles the subset of Drive's query language the provider
// sends and the tests use: terms joined by and, parentheses,
// 'id' in parents, name = / contains 'x', mimeType = / != 'x' and
// trashed = true|false. String literals escape ' and \ with a backslash.
func parseQuery(q string) (func(*File) bool, error) {
	p := &qparser{s: q}
	m, err := p.expr()
	if err == nil && strings.TrimSpace(p.s[p.i:]) != "" {
		err = fmt.Errorf("trailing %q", p.s[p.i:])
	}
	return m, err
}

type qparser struct {
	s string
	i int
}

func (p *qparser) skip() {
	for p.i < len(p.s) && unicode.IsSpace(rune(p.s[p.i])) {
		p.i++
	}
}

func (p *qparser) word() string {
	p.skip()
	j := p.i
	for j < len(p.s) && (unicode.IsLetter(rune(p.s[j])) || p.s[j] == '=' || p.s[j] == '!') {
		j++
	}
	w := p.s[p.i:j]
	p.i = j
	return w
}

func (p *qparser) literal() (string, error) {
	p.skip()
	if p.i >= len(p.s) || p.s[p.i] != '\'' {
		return "", fmt.Errorf("string literal expected at %d", p.i)
	}
	var b strings.Builder
	for p.i++; p.i < len(p.s); p.i++ {
		switch c := p.s[p.i]; c {
		case '\\':
			p.i++
			if p.i == len(p.s) {
				return "", fmt.Errorf("dangling escape")
			}
			b.WriteByte(p.s[p.i])
		case '\'':
			p.i++
			return b.String(), nil
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("unterminated literal")
}

func (p *qparser) expr() (func(*File) bool, error) {
	var terms []func(*File) bool
	for {
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		terms = append(terms, t)
		save := p.i
		if p.word() != "and" {
			p.i = save
			return func(fl *File) bool {
				for _, t := range terms {
					if !t(fl) {
						return false
					}
				}
				return true
			}, nil
		}
	}
}

func (p *qparser) term() (func(*File) bool, error) {
	p.skip()
	if p.i < len(p.s) && p.s[p.i] == '(' {
		p.i++
		m, err := p.expr()
		p.skip()
		if err != nil || p.i >= len(p.s) || p.s[p.i] != ')' {
			return nil, fmt.Errorf("unbalanced parenthesis")
		}
		p.i++
		return m, nil
	}
	if p.i < len(p.s) && p.s[p.i] == '\'' {
		id, err := p.literal()
		if err != nil {
			return nil, err
		}
		if p.word() != "in" || p.word() != "parents" {
			return nil, fmt.Errorf("'x' in parents expected")
		}
		return func(fl *File) bool { return slices.Contains(fl.Parents, id) }, nil
	}
	field, op := p.word(), p.word()
	if field == "trashed" && op == "=" {
		v := p.word()
		if v != "true" && v != "false" {
			return nil, fmt.Errorf("trashed = true|false")
		}
		return func(fl *File) bool { return fl.Trashed == (v == "true") }, nil
	}
	lit, err := p.literal()
	if err != nil {
		return nil, err
	}
	switch field + " " + op {
	case "name =":
		return func(fl *File) bool { return fl.Name == lit }, nil
	case "name contains":
		return func(fl *File) bool { return strings.Contains(strings.ToLower(fl.Name), strings.ToLower(lit)) }, nil
	case "mimeType =":
		return func(fl *File) bool { return fl.MimeType == lit }, nil
	case "mimeType !=":
		return func(fl *File) bool { return fl.MimeType != lit }, nil
	}
	return nil, fmt.Errorf("unsupported term %s %s", field, op)
}

// Query is the recorded request's query.
func (s Request) Query() url.Values {
	v, _ := url.ParseQuery(s.RawQuery)
	return v
}
