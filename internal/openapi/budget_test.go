package openapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/openapi/openapitest"
)

// loadDoc connects to doc read as a file by the default reader.
func loadDoc(t *testing.T, doc []byte, spec config.OpenAPI) (connect.Conn, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "doc.json")
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	spec.URL = path
	return New("hostile", spec, nil).Connect(context.Background())
}

// schemaSize is an operation's input schema in JSON values and bytes.
func schemaSize(t *testing.T, c connect.Conn, op string) (nodes, bytes int64) {
	t.Helper()
	o, ok := c.Manifest().Operation(op)
	if !ok {
		t.Fatalf("no operation %s", op)
	}
	var v any
	if err := json.Unmarshal(o.InputSchema, &v); err != nil {
		t.Fatal(err)
	}
	return measure(v), int64(len(o.InputSchema))
}

// A document whose refs multiply (width^levels copies when inlined) loads
// within the budget at every width: its refs are inlined less deep, the
// connection says which operations were reduced, and the rest of the
// document is untouched. Before the budget, 3 levels of 200 needed 1.6 GiB
// and 2 levels of 40 over a 1 MB description ran out of memory.
func TestFanOutLoadsWithinTheBudget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                     string
		levels, width, descBytes int
		depth                    int // the ref depth it fits at
	}{
		{"3 levels of 10", 3, 10, 10, 3},
		{"3 levels of 40", 3, 40, 10, 2},
		{"3 levels of 60", 3, 60, 10, 2},
		{"3 levels of 200", 3, 200, 10, 1},
		{"2 levels of 40 over 1 MB", 2, 40, 1 << 20, 2},
		{"1 level of 4000", 1, 4000, 10, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			c, err := loadDoc(t, openapitest.FanOut(tt.levels, tt.width, tt.descBytes), config.OpenAPI{})
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			nodes, bytes := schemaSize(t, c, openapitest.FanOutOp)
			if nodes > DefaultMaxSchemaNodes || bytes > DefaultMaxSchemaBytes {
				t.Fatalf("schema of %d values, %d bytes: over the budget", nodes, bytes)
			}
			info := c.Info()
			reduced, _ := info["schemasReduced"].(map[string]any)
			if tt.depth == maxRefDepth {
				if reduced != nil {
					t.Fatalf("schemasReduced = %v, want none", reduced)
				}
			} else if first, _ := reduced["first"].(map[string]int); reduced["count"] != 1 || first[openapitest.FanOutOp] != tt.depth {
				t.Fatalf("schemasReduced = %v, want %s at depth %d", reduced, openapitest.FanOutOp, tt.depth)
			}
			if n, _ := schemaSize(t, c, openapitest.PingOp); n != 6 {
				t.Fatalf("ping's schema has %d values", n)
			}
			t.Logf("%s: %d values, %d bytes, loaded in %s", tt.name, nodes, bytes, took)
		})
	}
}

// The same document loads the same way every time (the budget's cut does
// not depend on map order), so every replica agrees on the identity.
func TestBudgetIsDeterministic(t *testing.T) {
	t.Parallel()
	doc := openapitest.FanOut(3, 60, 10)
	var first string
	for range 3 {
		c, err := loadDoc(t, doc, config.OpenAPI{})
		if err != nil {
			t.Fatal(err)
		}
		if first == "" {
			first = c.Identity().Instance[strings.Index(c.Identity().Instance, "#"):]
		} else if got := c.Identity().Instance[strings.Index(c.Identity().Instance, "#"):]; got != first {
			t.Fatalf("instance %s, then %s", first, got)
		}
	}
}

// Documents that cannot fit fail the connection with an error naming the
// operation (when one is to blame), the setting and its limit; one that
// fits a raised limit loads.
func TestBudgetErrorsNameTheLimit(t *testing.T) {
	t.Parallel()
	bigDesc := fmt.Sprintf(`{"openapi":"3.1.0","info":{"title":"t","version":"1"},"servers":[{"url":"http://127.0.0.1:9"}],"paths":{"/a":{"post":{"operationId":"big","requestBody":{"content":{"application/json":{"schema":{"type":"object","description":"%s"}}}},"responses":{}}}}}`, strings.Repeat("x", 2<<20))
	tests := []struct {
		name    string
		doc     []byte
		spec    config.OpenAPI
		want    string
		setting string
	}{
		{"deep inline nesting", openapitest.Deep(4000), config.OpenAPI{}, "document nests deeper than 64 levels", ""},
		{"nesting over a lower limit", openapitest.Deep(25), config.OpenAPI{MaxSchemaNodes: 50}, "operation deep: input schema with no $ref inlined, over maxSchemaNodes (50)", "maxSchemaNodes"},
		{"a 2 MB description in a body", []byte(bigDesc), config.OpenAPI{}, "operation big: input schema with no $ref inlined, over maxSchemaBytes (1048576)", "maxSchemaBytes"},
		{"too many operations", manyOps(30), config.OpenAPI{MaxOperations: 20}, "more operations than that, over maxOperations (20): choose some with include", "maxOperations"},
		{"operations too large together", manyOps(300), config.OpenAPI{MaxManifestBytes: 10_000}, "over maxManifestBytes (10000)", "maxManifestBytes"},
		{"a document file larger than maxResponseBytes", openapitest.FanOut(1, 10, 4096), config.OpenAPI{MaxResponseBytes: 2048}, "larger than 2048 bytes (maxResponseBytes)", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadDoc(t, tt.doc, tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to say %q", err, tt.want)
			}
			if tt.setting == "" {
				return
			}
			var be *BudgetError
			if !errors.As(err, &be) || be.Setting != tt.setting || !strings.Contains(err.Error(), tt.setting) {
				t.Fatalf("err = %v, want a BudgetError on %s", err, tt.setting)
			}
		})
	}
	// Raised limits admit what the defaults refuse.
	if _, err := loadDoc(t, openapitest.Deep(25), config.OpenAPI{MaxSchemaNodes: 100}); err != nil {
		t.Fatalf("with maxSchemaNodes 100: %v", err)
	}
}

// An operation's description and title are cut: every model turn carries
// them.
func TestLongDescriptionsAreCut(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 10_000)
	doc := fmt.Sprintf(`{"openapi":"3.1.0","info":{"title":"t","version":"1"},"servers":[{"url":"http://127.0.0.1:9"}],"paths":{"/a":{"get":{"operationId":"a","summary":"%s","description":"%s","responses":{}}}}}`, long, long)
	c, err := loadDoc(t, []byte(doc), config.OpenAPI{})
	if err != nil {
		t.Fatal(err)
	}
	op, _ := c.Manifest().Operation("a")
	if len(op.Description) > maxDescriptionBytes || len(op.Annotations.Title) > maxTitleBytes {
		t.Fatalf("description %d bytes, title %d", len(op.Description), len(op.Annotations.Title))
	}
	if !strings.HasSuffix(op.Description, "…(cut)") || !strings.HasPrefix(op.Description, "GET /a: éé") {
		t.Fatalf("description = %.40q…%q", op.Description, op.Description[len(op.Description)-20:])
	}
}
