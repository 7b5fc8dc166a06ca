package connect

import (
	"slices"
	"strconv"
)

// MaxToolIDLen is the longest tool name a model is shown (the tool-name
// limit of the model APIs).
const MaxToolIDLen = 128

// ToolIDs names the tools of a connection for models: "<connection>_<op>".
// Characters outside [A-Za-z0-9_-] become '_' and names are cut to 128
// characters. A name that needed neither is kept as is; only reduced names
// are ever suffixed (_2, _3, …) when they collide, so adding a dotted
// operation never moves an existing tool's name. The map goes from
// operation name to tool name.
//
// internal/mcp.ToolIDs is this rule, so status and model turns name a tool
// alike.
func ToolIDs(connection string, ops []string) map[string]string {
	return ToolIDsWith(connection+"_", ops, nil)
}

// ToolIDsWith names ops as prefix+op, avoiding the names already taken.
func ToolIDsWith(prefix string, ops []string, taken map[string]bool) map[string]string {
	ids := make(map[string]string, len(ops))
	if taken == nil {
		taken = map[string]bool{}
	}
	var reduced []string
	for _, name := range ops {
		full := prefix + name
		if id := ReduceToolID(full); id == full && !taken[id] {
			ids[name] = id
			taken[id] = true
		} else if _, dup := ids[name]; !dup {
			reduced = append(reduced, name)
		}
	}
	slices.Sort(reduced)
	reduced = slices.Compact(reduced)
	for _, name := range reduced {
		base := ReduceToolID(prefix + name)
		id := base
		for n := 2; taken[id]; n++ {
			suffix := "_" + strconv.Itoa(n)
			id = base[:min(len(base), MaxToolIDLen-len(suffix))] + suffix
		}
		ids[name] = id
		taken[id] = true
	}
	return ids
}

// ReduceToolID replaces characters outside [A-Za-z0-9_-] with '_' and cuts
// the result to MaxToolIDLen bytes.
func ReduceToolID(s string) string {
	b := make([]byte, 0, min(len(s), MaxToolIDLen))
	for _, r := range s {
		if len(b) == MaxToolIDLen {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b = append(b, byte(r))
		default:
			b = append(b, '_')
		}
	}
	return string(b)
}
