package drive

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// tool is one operation: what the manifest declares and what runs it.
type tool struct {
	name, description string
	schema            string
	readOnly          bool
	destructive       bool
	idempotent        bool
	run               func(ctx context.Context, cl *call, a args) (any, error)
}

// Shared pieces of the input schemas.
const (
	idProp      = `{"type": "string", "pattern": "^[A-Za-z0-9_-]{1,200}$"`
	pathProp    = `{"type": "string", "minLength": 1, "maxLength": 4096`
	contentProp = `"content": {"type": "string", "description": "The file's whole content, as text."}, "mimeType": {"type": "string", "minLength": 1, "maxLength": 255, "description": "The content's MIME type; default text/plain."}`
)

var tools = []tool{
	{
		name:        "list_files",
		description: "List or search files. q is a Drive query (name contains 'report' and mimeType != 'application/vnd.google-apps.folder'); folderId lists a folder's children. With neither, the root folder's children are listed. Trashed files are left out unless q says otherwise.",
		schema: `{"type": "object", "additionalProperties": false, "properties": {
			"q": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "Drive query syntax."},
			"folderId": ` + idProp + `, "description": "Only this folder's children (combined with q when both are given)."},
			"pageSize": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "Default Drive's (100)."},
			"pageToken": {"type": "string", "minLength": 1, "description": "nextPageToken of the previous page."},
			"orderBy": {"type": "string", "minLength": 1, "maxLength": 200, "description": "Drive sort keys, e.g. modifiedTime desc."}}}`,
		readOnly: true, idempotent: true, run: listFiles,
	},
	{
		name:        "find_file",
		description: "Resolve a slash-separated path (A/B/file.txt) from the root folder to {found, file}. A name that matches two items in one folder fails rather than picking one.",
		schema: `{"type": "object", "additionalProperties": false, "required": ["path"], "properties": {
			"path": ` + pathProp + `, "description": "Folder names and a file name, separated by /."}}}`,
		readOnly: true, idempotent: true, run: findFile,
	},
	{
		name:        "read_file",
		description: "Read a file's content by fileId or path. Google Docs and Slides are exported as text/plain, Sheets as text/csv (the first sheet); other files are read as they are, as text when they are UTF-8, else base64.",
		schema: `{"type": "object", "additionalProperties": false, "minProperties": 1,
			"dependentSchemas": {"fileId": {"not": {"required": ["path"]}}},
			"properties": {
			"fileId": ` + idProp + `},
			"path": ` + pathProp + `, "description": "Instead of fileId: the file's path from the root folder."}}}`,
		readOnly: true, idempotent: true, run: readFile,
	},
	{
		name:        "create_file",
		description: "Create a new file with content in a folder (folderId or folderPath, which must exist; default the root folder). Drive allows two files of one name: use save_file to replace one by path.",
		schema: `{"type": "object", "additionalProperties": false, "required": ["name", "content"],
			"dependentSchemas": {"folderId": {"not": {"required": ["folderPath"]}}},
			"properties": {
			"name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^/]+$"},
			` + contentProp + `,
			"folderId": ` + idProp + `},
			"folderPath": ` + pathProp + `}}}`,
		run: createFile,
	},
	{
		name:        "update_file",
		description: "Replace the content of the file fileId.",
		schema: `{"type": "object", "additionalProperties": false, "required": ["fileId", "content"], "properties": {
			"fileId": ` + idProp + `},
			` + contentProp + `}}`,
		idempotent: true, run: updateFile,
	},
	{
		name:        "save_file",
		description: "Write content to a path from the root folder: the file is replaced when it exists and created otherwise, with any missing folders. A name that matches two items in one folder fails.",
		schema: `{"type": "object", "additionalProperties": false, "required": ["path", "content"], "properties": {
			"path": ` + pathProp + `},
			` + contentProp + `}}`,
		idempotent: true, run: saveFile,
	},
	{
		name:        "create_folder",
		description: "Create a folder named name in a parent folder (parentId or parentPath, which must exist; default the root folder).",
		schema: `{"type": "object", "additionalProperties": false, "required": ["name"],
			"dependentSchemas": {"parentId": {"not": {"required": ["parentPath"]}}},
			"properties": {
			"name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^/]+$"},
			"parentId": ` + idProp + `},
			"parentPath": ` + pathProp + `}}}`,
		run: createFolder,
	},
	{
		name:        "delete_file",
		description: "Delete a file or folder permanently (not to the trash), by fileId or path. A folder is deleted with everything in it.",
		schema: `{"type": "object", "additionalProperties": false, "minProperties": 1,
			"dependentSchemas": {"fileId": {"not": {"required": ["path"]}}},
			"properties": {
			"fileId": ` + idProp + `},
			"path": ` + pathProp + `}}}`,
		destructive: true, idempotent: true, run: deleteFile,
	},
}

var toolByName = func() map[string]tool {
	m := make(map[string]tool, len(tools))
	for _, t := range tools {
		m[t.name] = t
	}
	return m
}()

// operations is the manifest: every tool with its schema and hints.
// Every hint is declared (true or false) so a policy can rely on it.
func operations() []connect.Operation {
	ops := make([]connect.Operation, len(tools))
	for i, t := range tools {
		var schema json.RawMessage
		if err := json.Unmarshal([]byte(t.schema), &schema); err != nil {
			panic(fmt.Sprintf("drive: schema of %s: %v", t.name, err))
		}
		ro, de, id, ow := t.readOnly, t.destructive, t.idempotent, true
		ops[i] = connect.Operation{
			Name: t.name, Description: t.description, InputSchema: compact(schema),
			Annotations: connect.Annotations{ReadOnlyHint: &ro, DestructiveHint: &de, IdempotentHint: &id, OpenWorldHint: &ow},
		}
	}
	return ops
}

func compact(raw json.RawMessage) json.RawMessage {
	var v any
	_ = json.Unmarshal(raw, &v)
	b, _ := json.Marshal(v)
	return b
}

// args are a call's arguments, already checked against the schema.
type args map[string]any

func (a args) str(k string) string {
	s, _ := a[k].(string)
	return s
}

func (a args) int(k string) int {
	switch v := a[k].(type) {
	case float64:
		return int(v)
	case json.Number:
		n, _ := v.Int64()
		return int(n)
	case int:
		return v
	case int64:
		return int(v)
	}
	return 0
}

// result turns a value into JSON's generic types, as every other
// connection's results are.
func result(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	err = json.Unmarshal(b, &out)
	return out, err
}

func listFiles(ctx context.Context, cl *call, a args) (any, error) {
	q := a.str("q")
	folder := a.str("folderId")
	if folder == "" && q == "" {
		folder = cl.conn.root
	}
	if folder != "" {
		in := quote(folder) + " in parents"
		if q == "" {
			q = in + " and trashed = false"
		} else {
			q = "(" + q + ") and " + in
		}
	}
	page, err := cl.list(ctx, q, a.int("pageSize"), a.str("pageToken"), a.str("orderBy"))
	if err != nil {
		return nil, err
	}
	if page.Files == nil {
		page.Files = []file{}
	}
	return result(page)
}

func findFile(ctx context.Context, cl *call, a args) (any, error) {
	f, found, err := cl.resolve(ctx, a.str("path"))
	if err != nil {
		return nil, err
	}
	if !found {
		return map[string]any{"found": false}, nil
	}
	return result(map[string]any{"found": true, "file": f})
}

// target is the file a call names by fileId or path; a path that does
// not resolve is a CallError.
func (cl *call) target(ctx context.Context, a args) (file, error) {
	if id := a.str("fileId"); id != "" {
		return cl.metadata(ctx, id)
	}
	path := a.str("path")
	f, found, err := cl.resolve(ctx, path)
	if err != nil {
		return file{}, err
	}
	if !found {
		return file{}, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("no file at path %q", path)}
	}
	return f, nil
}

func (cl *call) metadata(ctx context.Context, id string) (file, error) {
	var f file
	err := cl.sendJSON(ctx, request{method: "GET", url: cl.apiURL(cl.conn.api, url.Values{"fields": {fileFields}}, "files", id)}, &f)
	return f, err
}

// exportAs is the text format each Google Workspace type is exported to.
var exportAs = map[string]string{
	"application/vnd.google-apps.document":     "text/plain",
	"application/vnd.google-apps.presentation": "text/plain",
	"application/vnd.google-apps.spreadsheet":  "text/csv",
}

func readFile(ctx context.Context, cl *call, a args) (any, error) {
	f, err := cl.target(ctx, a)
	if err != nil {
		return nil, err
	}
	limit := cl.conn.provider.maxFileBytes()
	var r request
	out := map[string]any{"file": f}
	switch export, ok := exportAs[f.MimeType]; {
	case f.isFolder():
		return nil, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("%q is a folder: list it with list_files and folderId %s", f.Name, f.ID)}
	case ok:
		r = request{method: "GET", url: cl.apiURL(cl.conn.api, url.Values{"mimeType": {export}}, "files", f.ID, "export")}
		out["exportedAs"] = export
	case strings.HasPrefix(f.MimeType, "application/vnd.google-apps."):
		return nil, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("%q is a %s, which has no text form to read", f.Name, f.MimeType)}
	default:
		if size, ok := parseSize(f.Size); ok && size > limit {
			return nil, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("%q is %d bytes, more than the %d this connection reads", f.Name, size, limit)}
		}
		r = request{method: "GET", url: cl.apiURL(cl.conn.api, url.Values{"alt": {"media"}}, "files", f.ID)}
	}
	r.limit = limit
	data, err := cl.send(ctx, r)
	if err != nil {
		return nil, err
	}
	if utf8.Valid(data) {
		out["content"], out["encoding"] = string(data), "utf-8"
	} else {
		out["content"], out["encoding"] = base64.StdEncoding.EncodeToString(data), "base64"
	}
	return result(out)
}

// parseSize reads Drive's size (an int64 sent as a string; absent for
// Workspace files and shortcuts).
func parseSize(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// content is a write's body and its MIME type, refused over the bound.
func (cl *call) content(a args) ([]byte, string, error) {
	body := []byte(a.str("content"))
	if limit := cl.conn.provider.maxFileBytes(); int64(len(body)) > limit {
		return nil, "", &connect.CallError{Op: cl.op, Message: fmt.Sprintf("content is %d bytes, more than the %d this connection writes", len(body), limit)}
	}
	mt := a.str("mimeType")
	if mt == "" {
		mt = "text/plain"
	}
	return body, mt, nil
}

func createFile(ctx context.Context, cl *call, a args) (any, error) {
	body, mt, err := cl.content(a)
	if err != nil {
		return nil, err
	}
	parent := a.str("folderId")
	if parent == "" {
		if parent, err = cl.folderAt(ctx, a.str("folderPath"), false); err != nil {
			return nil, err
		}
	}
	f, err := cl.createWithContent(ctx, a.str("name"), parent, body, mt)
	if err != nil {
		return nil, err
	}
	return result(f)
}

// createWithContent is files.create as a multipart upload: the metadata
// as JSON, then the content, in one multipart/related body.
func (cl *call) createWithContent(ctx context.Context, name, parent string, body []byte, mimeType string) (file, error) {
	meta, err := json.Marshal(map[string]any{"name": name, "parents": []string{parent}, "mimeType": mimeType})
	if err != nil {
		return file{}, err
	}
	var buf strings.Builder
	w := multipart.NewWriter(&buf)
	part, err := w.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json; charset=UTF-8"}})
	if err != nil {
		return file{}, err
	}
	part.Write(meta)
	if part, err = w.CreatePart(textproto.MIMEHeader{"Content-Type": {mimeType}}); err != nil {
		return file{}, err
	}
	part.Write(body)
	if err := w.Close(); err != nil {
		return file{}, err
	}
	var f file
	err = cl.sendJSON(ctx, request{
		method: "POST", url: cl.apiURL(cl.conn.upload, url.Values{"uploadType": {"multipart"}, "fields": {fileFields}}, "files"),
		body: []byte(buf.String()), contentType: "multipart/related; boundary=" + w.Boundary(),
	}, &f)
	return f, err
}

func updateFile(ctx context.Context, cl *call, a args) (any, error) {
	body, mt, err := cl.content(a)
	if err != nil {
		return nil, err
	}
	f, err := cl.updateContent(ctx, a.str("fileId"), body, mt)
	if err != nil {
		return nil, err
	}
	return result(f)
}

// updateContent is files.update as a media upload: the body is the new
// content, the metadata stays.
func (cl *call) updateContent(ctx context.Context, id string, body []byte, mimeType string) (file, error) {
	var f file
	err := cl.sendJSON(ctx, request{
		method: "PATCH", url: cl.apiURL(cl.conn.upload, url.Values{"uploadType": {"media"}, "fields": {fileFields}}, "files", id),
		body: body, contentType: mimeType,
	}, &f)
	return f, err
}

func saveFile(ctx context.Context, cl *call, a args) (any, error) {
	body, mt, err := cl.content(a)
	if err != nil {
		return nil, err
	}
	path := a.str("path")
	names, err := splitPath(path)
	if err != nil {
		return nil, &connect.CallError{Op: cl.op, Message: err.Error()}
	}
	dir, name := strings.Join(names[:len(names)-1], "/"), names[len(names)-1]
	parent, err := cl.folderAt(ctx, dir, true)
	if err != nil {
		return nil, err
	}
	matches, err := cl.children(ctx, parent, name, false)
	if err != nil {
		return nil, err
	}
	existing, found, err := cl.one(matches, name, fmt.Sprintf("folder %q", dir))
	if err != nil {
		return nil, err
	}
	var f file
	switch {
	case found && existing.isFolder():
		return nil, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("%q is a folder; a file cannot replace it", path)}
	case found:
		f, err = cl.updateContent(ctx, existing.ID, body, mt)
	default:
		f, err = cl.createWithContent(ctx, name, parent, body, mt)
	}
	if err != nil {
		return nil, err
	}
	return result(map[string]any{"created": !found, "file": f})
}

func createFolder(ctx context.Context, cl *call, a args) (any, error) {
	parent := a.str("parentId")
	if parent == "" {
		var err error
		if parent, err = cl.folderAt(ctx, a.str("parentPath"), false); err != nil {
			return nil, err
		}
	}
	f, err := cl.createFolder(ctx, a.str("name"), parent)
	if err != nil {
		return nil, err
	}
	return result(f)
}

// createFolder is files.create with metadata only.
func (cl *call) createFolder(ctx context.Context, name, parent string) (file, error) {
	meta, err := json.Marshal(map[string]any{"name": name, "mimeType": FolderMIME, "parents": []string{parent}})
	if err != nil {
		return file{}, err
	}
	var f file
	err = cl.sendJSON(ctx, request{
		method: "POST", url: cl.apiURL(cl.conn.api, url.Values{"fields": {fileFields}}, "files"),
		body: meta, contentType: "application/json; charset=UTF-8",
	}, &f)
	return f, err
}

func deleteFile(ctx context.Context, cl *call, a args) (any, error) {
	id := a.str("fileId")
	if id == "" {
		f, err := cl.target(ctx, a)
		if err != nil {
			return nil, err
		}
		id = f.ID
	}
	if _, err := cl.send(ctx, request{method: "DELETE", url: cl.apiURL(cl.conn.api, nil, "files", id)}); err != nil {
		return nil, err
	}
	return map[string]any{"deleted": true, "fileId": id}, nil
}
