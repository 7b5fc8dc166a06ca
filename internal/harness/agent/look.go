package agent

import (
	"encoding/json"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// EventLook is one read shown to a model.
const EventLook = "look"

// EntryLook marks the ledger entry of a round's context layer.
const EntryLook = "look"

// Look forms: how a read was shown.
const (
	LookFull      = "full"
	LookDiff      = "diff"
	LookUnchanged = "unchanged"
	LookFailed    = "failed"
)

// MaxDiffLines bounds the changed lines a diff compares (its LCS table is
// their product: 4 MB at most); a read changed more is shown whole.
const MaxDiffLines = 1000

// LookObserver is implemented by an Observer that counts what looking
// costs. It is separate so existing Observers keep compiling.
type LookObserver interface {
	// LookTokens records one read shown to a model: its read name, its
	// form (full, diff, unchanged, failed) and its estimated tokens.
	LookTokens(read, form string, tokens int)
}

// EstimateTokens is a text's size in tokens, estimated as bytes/4.
func EstimateTokens(s string) int { return (len(s) + 3) / 4 }

// LookRead is one read of a layer and when it is taken.
type LookRead struct {
	Name   string
	Timing string
}

// LookConn is one connection of a layer.
type LookConn struct {
	Name  string
	Reads []LookRead
}

// LookLayer is the context layer of one model turn.
type LookLayer struct {
	Conns []LookConn
	// Shown is the whole render of each read the model last saw, by
	// "<connection>\x00<read>".
	Shown map[string]string
	// Ask maps each "<connection>_look" tool to its connection.
	Ask map[string]string
}

// LookShown is one read as a layer entry or a _look answer records it.
type LookShown struct {
	Connection string `json:"connection"`
	Read       string `json:"read"`
	Form       string `json:"form"`
	Tokens     int    `json:"tokens"`
	// Render is the read's whole render, what the next diff compares
	// with; empty when it failed.
	Render string `json:"render,omitempty"`
}

// LookRecord is the output of a look ledger entry.
type LookRecord struct {
	Text  string      `json:"text"`
	Reads []LookShown `json:"reads"`
}

// AddLookTools offers "<connection>_look" for each connection of the layer
// with reads the model asks for. A name a tool already has is a
// collision, as between connections.
func (l *LookLayer) AddLookTools(ts *ToolSet) error {
	for _, c := range l.Conns {
		var asks []string
		for _, rd := range c.Reads {
			if rd.Timing == profiles.LookAsk {
				asks = append(asks, rd.Name)
			}
		}
		if len(asks) == 0 {
			continue
		}
		name := c.Name + "_look"
		if _, taken := ts.ByName[name]; taken {
			return fault.Errorf(document.CodeToolIDCollision, "tool id %q names both an operation of %s and the look tool of its profile reads; rename the connection or narrow its operations", name, c.Name)
		}
		schema, _ := json.Marshal(map[string]any{"type": "object", "required": []string{"read"}, "properties": map[string]any{
			"read": map[string]any{"type": "string", "enum": asks, "description": "The read to take."},
			"full": map[string]any{"type": "boolean", "description": "Show it whole rather than as changes since you last saw it."},
		}})
		ro := true
		ts.Add(&modelTool{Op: document.LookOp, Targets: []string{c.Name}, ModelTool: ModelTool{Name: name, InputSchema: schema,
			Description: "[" + c.Name + "] Look at the connection's state: " + strings.Join(asks, ", ") + ". (read-only)",
			Annotations: connect.Annotations{ReadOnlyHint: &ro}}})
		l.Ask[name] = c.Name
	}
	return nil
}

// Due lists, per connection, the reads to take before round: turn reads
// always; effect reads before the first round and after a round with an
// effect on the connection.
func (l *LookLayer) Due(round int, effected map[string]bool) map[string][]string {
	out := map[string][]string{}
	for _, c := range l.Conns {
		for _, rd := range c.Reads {
			if rd.Timing == profiles.LookTurn || (rd.Timing == profiles.LookEffect && (round == 1 || effected[c.Name])) {
				out[c.Name] = append(out[c.Name], rd.Name)
			}
		}
	}
	return out
}

// Show is how a read's render is shown given what the model last saw of
// it, and remembers it as last seen.
func (l *LookLayer) Show(conn, read, render string, full bool) (form, text string) {
	key := conn + "\x00" + read
	prev, seen := l.Shown[key]
	l.Shown[key] = render
	switch {
	case !seen || full:
		return LookFull, render
	case prev == render:
		return LookUnchanged, ""
	}
	if d, ok := LineDiff(prev, render); ok {
		return LookDiff, d
	}
	return LookFull, render
}

// Remember replays recorded reads into what the model last saw.
func (l *LookLayer) Remember(reads []LookShown) {
	for _, s := range reads {
		if s.Form != LookFailed {
			l.Shown[s.Connection+"\x00"+s.Read] = s.Render
		}
	}
}

// LookHeader is the line above a read in what the model is shown.
func LookHeader(conn, read, form string) string {
	switch form {
	case LookDiff:
		return "[" + conn + " " + read + ": changes since last shown]"
	case LookUnchanged:
		return "[" + conn + " " + read + ": unchanged]"
	case LookFailed:
		return "[" + conn + " " + read + ": could not be read]"
	}
	return "[" + conn + " " + read + "]"
}

// Asks reports whether read is one of conn's reads the model asks for.
func (l *LookLayer) Asks(conn, read string) bool {
	for _, c := range l.Conns {
		if c.Name != conn {
			continue
		}
		for _, rd := range c.Reads {
			if rd.Name == read && rd.Timing == profiles.LookAsk {
				return true
			}
		}
	}
	return false
}

func DecodeLook(out any) (*LookRecord, error) { return decodeLedger[LookRecord]("look", out) }

// LineDiff lists the lines removed from a ("- ") and added in b ("+ "),
// in order: the lines both start and end with are skipped, and the rest
// compared by a longest common subsequence. ok is false when what is left
// to compare has more than maxDiffLines lines on either side.
func LineDiff(a, b string) (string, bool) {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	for len(x) > 0 && len(y) > 0 && x[0] == y[0] {
		x, y = x[1:], y[1:]
	}
	for len(x) > 0 && len(y) > 0 && x[len(x)-1] == y[len(y)-1] {
		x, y = x[:len(x)-1], y[:len(y)-1]
	}
	if len(x) > MaxDiffLines || len(y) > MaxDiffLines {
		return "", false
	}
	// lcs[i][j] is the LCS length of x[i:] and y[j:].
	lcs := make([][]int32, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int32, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, "- "+x[i])
			i++
		default:
			out = append(out, "+ "+y[j])
			j++
		}
	}
	return strings.Join(out, "\n"), true
}
