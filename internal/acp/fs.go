package acp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// FSOptions turns on the fs capability: the agent reads (and, with Write,
// writes) text files through patchbay instead of its own file system
// access, confined to Root.
type FSOptions struct {
	// Root is the directory (absolute) every path must lie under once
	// cleaned and its symlinks resolved.
	Root string
	// Write declares fs.writeTextFile too.
	Write bool
	// MaxBytes bounds a file written, and the content a read returns.
	// Default 4 MiB.
	MaxBytes int64
}

const defaultMaxFileBytes = 4 << 20

// fsys serves fs/* inside a root. Paths are resolved (filepath.EvalSymlinks)
// and checked against the resolved root, so that an absolute symlink that
// stays inside is followed; the file is then opened through an os.Root,
// which refuses any escape a symlink swapped in meanwhile would make.
type fsys struct {
	root     *os.Root
	resolved string // the root, its symlinks resolved
	write    bool
	max      int64
}

func newFS(o FSOptions) (*fsys, error) {
	if !filepath.IsAbs(o.Root) {
		return nil, fmt.Errorf("root %q is not absolute", o.Root)
	}
	resolved, err := filepath.EvalSymlinks(o.Root)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(resolved)
	if err != nil {
		return nil, err
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = defaultMaxFileBytes
	}
	return &fsys{root: root, resolved: resolved, write: o.Write, max: o.MaxBytes}, nil
}

func (f *fsys) close() {
	if f != nil {
		_ = f.root.Close()
	}
}

// errOutside is the agent asking for a path outside the root.
func errOutside(path string) error {
	return invalidParams("%s is outside the directory the agent may access", path)
}

// rel returns path (absolute, as ACP requires) relative to the root, once
// cleaned and resolved; the part of it that does not exist yet (a file to
// write) is kept as given.
func (f *fsys) rel(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", invalidParams("path %q is not absolute", path)
	}
	resolved, err := resolveExisting(filepath.Clean(path))
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(f.resolved, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", errOutside(path)
	}
	return rel, nil
}

// resolveExisting resolves the symlinks of path's longest existing prefix
// and appends the rest.
func resolveExisting(path string) (string, error) {
	var rest []string
	for {
		resolved, err := filepath.EvalSymlinks(path)
		if err == nil {
			return filepath.Join(append([]string{resolved}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("resolve %s: %w", path, err)
		}
		parent := filepath.Dir(path)
		if parent == path {
			return "", fmt.Errorf("resolve %s: %w", path, err)
		}
		rest = append([]string{filepath.Base(path)}, rest...)
		path = parent
	}
}

// fileError is the JSON-RPC error for a failed file operation.
func fileError(path string, err error) error {
	var re *RPCError
	switch {
	case errors.As(err, &re):
		return re
	case errors.Is(err, fs.ErrNotExist):
		return &RPCError{Code: CodeNotFound, Message: fmt.Sprintf("%s does not exist", path)}
	case strings.Contains(err.Error(), "path escapes from parent"):
		return errOutside(path)
	}
	return fmt.Errorf("%s: %w", path, err)
}

// read returns the text of the file at path from line (1-based; 0 is 1)
// for limit lines (negative: to the end), or an error past f.max bytes.
func (f *fsys) read(path string, line, limit int) (string, error) {
	rel, err := f.rel(path)
	if err != nil {
		return "", err
	}
	// Stat first: opening a FIFO would block.
	if info, err := f.root.Stat(rel); err != nil {
		return "", fileError(path, err)
	} else if !info.Mode().IsRegular() {
		return "", invalidParams("%s is not a regular file", path)
	}
	file, err := f.root.Open(rel)
	if err != nil {
		return "", fileError(path, err)
	}
	defer file.Close()
	text, err := readLines(file, line, limit, f.max)
	if err != nil {
		return "", fileError(path, err)
	}
	return text, nil
}

// readLines returns lines [line, line+limit) of r, at most max bytes.
func readLines(r io.Reader, line, limit int, max int64) (string, error) {
	line = max1(line)
	br := bufio.NewReaderSize(r, 64<<10)
	var out strings.Builder
	for n, taken := 1, 0; limit < 0 || taken < limit; {
		chunk, err := br.ReadSlice('\n')
		if n >= line {
			if int64(out.Len()+len(chunk)) > max {
				return "", invalidParams("the text read exceeds %d bytes: ask for fewer lines", max)
			}
			out.Write(chunk)
		}
		switch {
		case err == nil:
			if n >= line {
				taken++
			}
			n++
		case errors.Is(err, bufio.ErrBufferFull):
			// The same line goes on.
		case errors.Is(err, io.EOF):
			return out.String(), nil
		default:
			return "", err
		}
	}
	return out.String(), nil
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// writeFile writes content to the file at path, creating it and its
// missing parent directories.
func (f *fsys) writeFile(path, content string) error {
	if int64(len(content)) > f.max {
		return invalidParams("content of %d bytes exceeds %d bytes", len(content), f.max)
	}
	rel, err := f.rel(path)
	if err != nil {
		return err
	}
	if info, err := f.root.Stat(rel); err == nil && !info.Mode().IsRegular() {
		return invalidParams("%s is not a regular file", path)
	}
	if dir := filepath.Dir(rel); dir != "." {
		if err := f.root.MkdirAll(dir, 0o755); err != nil {
			return fileError(path, err)
		}
	}
	if err := f.root.WriteFile(rel, []byte(content), 0o644); err != nil {
		return fileError(path, err)
	}
	return nil
}

type readTextFileParams struct {
	SessionID string `json:"sessionId"`
	Path      string `json:"path"`
	Line      *int   `json:"line"`
	Limit     *int   `json:"limit"`
}

func (c *Conn) readTextFile(in *incoming, params json.RawMessage) (any, error) {
	var p readTextFileParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if err := c.knownSession(p.SessionID); err != nil {
		return nil, err
	}
	line, limit := 0, -1
	if p.Line != nil {
		line = *p.Line
	}
	if p.Limit != nil {
		limit = *p.Limit
	}
	text, err := c.fs.read(p.Path, line, limit)
	if err != nil {
		return nil, err
	}
	return struct {
		Content string `json:"content"`
	}{text}, nil
}

type writeTextFileParams struct {
	SessionID string `json:"sessionId"`
	Path      string `json:"path"`
	Content   string `json:"content"`
}

func (c *Conn) writeTextFile(in *incoming, params json.RawMessage) (any, error) {
	var p writeTextFileParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if err := c.knownSession(p.SessionID); err != nil {
		return nil, err
	}
	if err := c.fs.writeFile(p.Path, p.Content); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}
