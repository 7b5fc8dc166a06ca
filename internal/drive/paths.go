package drive

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// file is a Drive file resource with the fields this provider asks for.
type file struct {
	ID           string   `json:"id"`
	Name         string   `json:"name"`
	MimeType     string   `json:"mimeType"`
	Parents      []string `json:"parents,omitempty"`
	Size         string   `json:"size,omitempty"` // int64 as a string, as Drive sends it
	ModifiedTime string   `json:"modifiedTime,omitempty"`
	WebViewLink  string   `json:"webViewLink,omitempty"`
}

func (f file) isFolder() bool { return f.MimeType == FolderMIME }

// fileList is the answer of files.list.
type fileList struct {
	Files            []file `json:"files"`
	NextPageToken    string `json:"nextPageToken,omitempty"`
	IncompleteSearch bool   `json:"incompleteSearch,omitempty"`
}

// queryQuoter escapes a value for a Drive query string literal: a
// backslash and a single quote are each escaped with a backslash (the
// backslash first, or the quote's escape would be doubled).
var queryQuoter = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// quote is s as a Drive query string literal.
func quote(s string) string { return "'" + queryQuoter.Replace(s) + "'" }

// splitPath cuts a slash-separated path into names. Empty segments
// (leading, trailing or doubled slashes) are dropped; . and .. are
// refused, as Drive has no such entries and a name may really be "..".
func splitPath(p string) ([]string, error) {
	var names []string
	for _, s := range strings.Split(p, "/") {
		switch s {
		case "":
			continue
		case ".", "..":
			return nil, fmt.Errorf("path %q: %q is not a name Drive paths have here", p, s)
		}
		names = append(names, s)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("path %q names no file", p)
	}
	return names, nil
}

// maxChildPages bounds the pages read to find one name in a folder: Drive
// may answer a short page with a next page token.
const maxChildPages = 10

// children lists the items named name directly in folder parent (folders
// only when folders is set). Drive's name comparison is not guaranteed to
// be exact, so the answer is filtered to exact matches.
func (cl *call) children(ctx context.Context, parent, name string, folders bool) ([]file, error) {
	q := fmt.Sprintf("%s in parents and name = %s and trashed = false", quote(parent), quote(name))
	if folders {
		q += " and mimeType = " + quote(FolderMIME)
	}
	var out []file
	token := ""
	for range maxChildPages {
		page, err := cl.list(ctx, q, 100, token, "")
		if err != nil {
			return nil, err
		}
		for _, f := range page.Files {
			if f.Name == name {
				out = append(out, f)
			}
		}
		if token = page.NextPageToken; token == "" || len(out) > 1 {
			return out, nil
		}
	}
	return nil, &connect.CallError{Op: cl.op, Message: fmt.Sprintf("looking up %q: Drive kept paging past %d pages", name, maxChildPages)}
}

// list runs one files.list.
func (cl *call) list(ctx context.Context, q string, pageSize int, pageToken, orderBy string) (fileList, error) {
	v := url.Values{}
	v.Set("q", q)
	v.Set("fields", "nextPageToken,incompleteSearch,files("+fileFields+")")
	v.Set("includeItemsFromAllDrives", "true")
	if pageSize > 0 {
		v.Set("pageSize", strconv.Itoa(pageSize))
	}
	if pageToken != "" {
		v.Set("pageToken", pageToken)
	}
	if orderBy != "" {
		v.Set("orderBy", orderBy)
	}
	var page fileList
	err := cl.sendJSON(ctx, request{method: "GET", url: cl.apiURL(cl.conn.api, v, "files")}, &page)
	return page, err
}

// one picks the single match of name in a folder: none is (file{},
// false), two or more fail, since picking one would act on a file nobody
// chose.
func (cl *call) one(matches []file, name, where string) (file, bool, error) {
	switch len(matches) {
	case 0:
		return file{}, false, nil
	case 1:
		return matches[0], true, nil
	}
	ids := make([]string, len(matches))
	for i, f := range matches {
		ids[i] = f.ID
	}
	return file{}, false, &connect.CallError{Op: cl.op, Message: fmt.Sprintf(
		"%d items named %q in %s (ids %s): the path is ambiguous, so nothing was picked; use a fileId",
		len(matches), name, where, strings.Join(ids, ", "))}
}

// resolve finds the file at path under the root folder. found is false
// when some segment does not exist; an ambiguous segment fails.
func (cl *call) resolve(ctx context.Context, path string) (file, bool, error) {
	names, err := splitPath(path)
	if err != nil {
		return file{}, false, &connect.CallError{Op: cl.op, Message: err.Error()}
	}
	parent, where := cl.conn.root, "the root folder"
	for i, name := range names {
		last := i == len(names)-1
		matches, err := cl.children(ctx, parent, name, !last)
		if err != nil {
			return file{}, false, err
		}
		f, ok, err := cl.one(matches, name, where)
		if err != nil || !ok {
			return file{}, false, err
		}
		if last {
			return f, true, nil
		}
		parent, where = f.ID, strconv.Quote(strings.Join(names[:i+1], "/"))
	}
	panic("unreachable: splitPath returns at least one name")
}

// folderAt resolves a folder path ("" is the root folder); when create is
// set, missing folders are created on the way.
func (cl *call) folderAt(ctx context.Context, path string, create bool) (string, error) {
	if strings.Trim(path, "/") == "" {
		return cl.conn.root, nil
	}
	names, err := splitPath(path)
	if err != nil {
		return "", &connect.CallError{Op: cl.op, Message: err.Error()}
	}
	parent, where := cl.conn.root, "the root folder"
	for i, name := range names {
		matches, err := cl.children(ctx, parent, name, true)
		if err != nil {
			return "", err
		}
		f, ok, err := cl.one(matches, name, where)
		if err != nil {
			return "", err
		}
		if !ok {
			if !create {
				return "", &connect.CallError{Op: cl.op, Message: fmt.Sprintf("no folder %q in %s", name, where)}
			}
			if f, err = cl.createFolder(ctx, name, parent); err != nil {
				return "", err
			}
		}
		parent, where = f.ID, strconv.Quote(strings.Join(names[:i+1], "/"))
	}
	return parent, nil
}
