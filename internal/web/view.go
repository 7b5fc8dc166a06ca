package web

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/a-h/templ"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

func csrfHeaders(token string) string {
	if token == "" {
		return ""
	}
	b, _ := json.Marshal(map[string]string{csrfHeader: token})
	return string(b)
}

// pretty renders a value (already redacted by the harness) as indented
// JSON; raw JSON is re-indented.
func pretty(v any) string {
	if raw, ok := v.(json.RawMessage); ok {
		var x any
		if json.Unmarshal(raw, &x) != nil {
			return string(raw)
		}
		v = x
	}
	if v == nil {
		return "null"
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

func whenPtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return when(*t)
}

func info(s registry.Status, key string) string {
	if v, ok := s.Info[key]; ok && v != nil && v != "" {
		return fmt.Sprint(v)
	}
	return "—"
}

// orDash is s, or a dash when it is empty.
func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// infoList is a list in a status's info as lines: strings as they are,
// anything else (an include expression, {"$expr": …}) as its one key and
// value, else its JSON.
func infoList(s registry.Status, key string) []string {
	v, ok := s.Info[key]
	if !ok || v == nil {
		return nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(data, &items) != nil {
		return []string{string(data)}
	}
	out := make([]string, 0, len(items))
	for _, raw := range items {
		var str string
		var one map[string]string
		switch {
		case json.Unmarshal(raw, &str) == nil:
			out = append(out, str)
		case json.Unmarshal(raw, &one) == nil && len(one) == 1:
			for k, v := range one {
				out = append(out, k+": "+v)
			}
		default:
			out = append(out, string(raw))
		}
	}
	return out
}

// hasHTTP reports whether some operation sends an HTTP request of its
// own (an OpenAPI connection's), so the page shows a column for it.
func hasHTTP(ops []connect.Operation) bool {
	for _, op := range ops {
		if op.HTTP != nil {
			return true
		}
	}
	return false
}

// hints lists the annotations an operation declares, in words.
func hints(a connect.Annotations) []string {
	var out []string
	add := func(p *bool, yes, no string) {
		if p == nil {
			return
		}
		if *p {
			out = append(out, yes)
		} else if no != "" {
			out = append(out, no)
		}
	}
	add(a.ReadOnlyHint, "read-only", "writes")
	add(a.DestructiveHint, "destructive", "not destructive")
	add(a.IdempotentHint, "idempotent", "")
	add(a.OpenWorldHint, "open world", "closed world")
	return out
}

func itoa(n int64) string { return fmt.Sprint(n) }

func shortID(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

// scopeText is an owner or repository of a GitHub App scope as
// configured: the name, or the expression over principal.
func scopeText(literal, expr string) string {
	if expr != "" {
		return "$expr: " + expr
	}
	return literal
}

// permissionsText is a GitHub App scope's permissions, sorted by name
// ("contents: read, issues: write"), or the expression returning them.
func permissionsText(perms map[string]string, expr string) string {
	if expr != "" {
		return "$expr: " + expr
	}
	parts := make([]string, 0, len(perms))
	for _, name := range slices.Sorted(maps.Keys(perms)) {
		parts = append(parts, name+": "+perms[name])
	}
	return joinList(parts)
}

func joinList(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}

func grantSummary(al *gates.Allowlist) string {
	var parts []string
	for _, conn := range slices.Sorted(maps.Keys(al.Connections)) {
		parts = append(parts, conn+" ("+strings.Join(al.Connections[conn].Ops, ", ")+")")
	}
	if len(parts) == 0 {
		return "grants nothing"
	}
	return strings.Join(parts, "; ")
}

func hasRowErrors(rows []grantRow) bool {
	for _, r := range rows {
		for _, m := range r.Errors {
			if len(m) > 0 {
				return true
			}
		}
	}
	return false
}

func formAction(f allowlistForm) templ.SafeURL {
	if f.IsNew {
		return "/admin/allowlists"
	}
	return templ.URL("/admin/allowlists/" + f.Name)
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// jsonText is v as compact JSON, for small values shown inline.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "?"
	}
	return string(b)
}

// cursorAge says how long ago a subscription's persisted cursor moved.
// hookExpiry is when a webhook subscription lapses unless refreshed.
func hookExpiry(s triggers.SubscriptionStatus) string {
	switch {
	case s.Mode != connect.DeliveryWebhook:
		return "—"
	case s.ExpiresAt != nil:
		return when(*s.ExpiresAt)
	case s.SubscriptionID != "":
		return "never"
	}
	return "not subscribed yet"
}

func cursorAge(s triggers.SubscriptionStatus) string {
	if s.CursorAgeSeconds == nil {
		return "no cursor yet"
	}
	return (time.Duration(*s.CursorAgeSeconds) * time.Second).String() + " ago"
}

// gateName says what each gate checks, for the step that it refused.
func gateName(gate int) string {
	switch gate {
	case fault.GateDeclared:
		return "operation declared"
	case fault.GateSchema:
		return "arguments match the schema"
	case fault.GateRefs:
		return "refs issued to this thread"
	case fault.GatePolicy:
		return "connection policy"
	case fault.GateApprover:
		return "approval"
	case fault.GateSecrets:
		return "secrets and credentials"
	}
	return "unknown"
}
