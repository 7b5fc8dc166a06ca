// Package proctree owns the process trees patchbay starts for stdio
// servers: it names each tree with a tag that every process of it carries
// in its environment (Var), finds the tree's processes again from the tag
// alone, kills them, and says which process (Owner) on which host started
// a tree, so that another process on the same host can end a tree whose
// owner died.
//
// A process group is not enough to hold a tree: a server may start
// helpers in a session of their own (Playwright starts its browser with
// setsid, and Chromium's crash handler double-forks to init), which a
// signal to the server's group does not reach and which outlive the
// server. The environment is inherited across setsid, fork and exec, so
// Find looks for the tag in every process's environment (/proc/PID/environ)
// and adds:
//   - the members of the process groups and sessions led by a tagged
//     process (Chromium's zygotes and renderers overwrite their environment
//     with their process title, but stay in the browser's group);
//   - the descendants of everything found, by parent id (a child that
//     cleared its environment, as long as its parent lives).
//
// Limits: Linux only (/proc; elsewhere Supported is false and Find finds
// nothing, so only the server's process group is killed); processes of
// other users whose environment cannot be read are not found; a process
// that both cleared its environment and left its group after its parent
// exited is not found. patchbay's own process, group and session are never
// signalled.
//
// It also owns the child that leads a tree (Child: started in a group of
// its own with the tag, stopped with its whole tree), which stdio MCP
// servers and coding agents share.
//
// DESIGN.md's layout has no place for it: the mcp provider and the ACP
// client (which start and close trees) and pools (which records them and
// sweeps what a crash left) all need it, and providers do not import each
// other.
package proctree

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Var is the environment variable that carries a tree's tag.
const Var = "PATCHBAY_PROCESS_TREE"

// NewTag returns a fresh random tag.
func NewTag() string { return "pt-" + strings.ToLower(rand.Text()) }

// Env is the environment entry that tags a child with tag.
func Env(tag string) string { return Var + "=" + tag }

type tagKey struct{}

// WithTag returns ctx carrying the tag a stdio server started under it
// must use: the pool decides and records a lease's tag before it asks the
// provider for the lease's connection, so that a crash in between leaves a
// record to sweep.
func WithTag(ctx context.Context, tag string) context.Context {
	return context.WithValue(ctx, tagKey{}, tag)
}

// TagFrom returns the tag ctx carries, or "".
func TagFrom(ctx context.Context) string {
	tag, _ := ctx.Value(tagKey{}).(string)
	return tag
}

// Proc is one process of a tree.
type Proc struct {
	PID, PPID, PGID, SID int
	Comm                 string
}

// Owner names a process on a host: the host's boot and pid namespace, the
// pid, and the process's start time (so a reused pid is not taken for
// the owner).
type Owner struct {
	Host  string `json:"host"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

func (o Owner) String() string {
	return o.Host + "/" + strconv.Itoa(o.PID) + "@" + strconv.FormatUint(o.Start, 10)
}

// Tree is the process tree tagged Tag. It remembers the process groups
// and sessions its processes led when it was last found: their members
// stay the tree's for a while after the leader exits (Chromium's helpers
// after the browser), untagged and no longer its descendants. A Tree is
// safe for concurrent use.
type Tree struct {
	Tag string

	mu    sync.Mutex
	leads map[int]bool
}

// NewTree returns the tree tagged tag, nothing found yet.
func NewTree(tag string) *Tree { return &Tree{Tag: tag, leads: map[int]bool{}} }

// Find returns the live processes of the tree tagged tag: NewTree(tag).Find.
func Find(tag string) ([]Proc, error) { return NewTree(tag).Find() }

// End ends the tree tagged tag: NewTree(tag).End.
func End(tag string, grace, wait time.Duration) (int, error) { return NewTree(tag).End(grace, wait) }

// Kill kills the tree tagged tag: NewTree(tag).Kill.
func Kill(tag string, wait time.Duration) (int, error) { return NewTree(tag).Kill(wait) }
