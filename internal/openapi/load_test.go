package openapi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

// manyOps is a document of n operations without operationIds.
func manyOps(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"openapi":"3.0.3","info":{"title":"t","version":"1"},"servers":[{"url":"https://api.example.com"}],"paths":{`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"/things%d/{id}":{"get":{"tags":["t%d"],"parameters":[{"name":"id","in":"path","required":true,"schema":{"type":"integer"}}],"responses":{}}}`, i, i%2)
	}
	b.WriteString("}}")
	return []byte(b.String())
}

func TestManyOperationsWarn(t *testing.T) {
	t.Parallel()
	doc := manyOps(WarnOperations + 1)
	tests := []struct {
		name    string
		include []string
		ops     int
		warn    bool
	}{
		{"all", nil, WarnOperations + 1, true},
		{"include", []string{"t1"}, (WarnOperations + 1) / 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			p := New("many", config.OpenAPI{URL: "api.json", Include: config.IncludeNames(tt.include...)}, &Options{
				Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
				ReadFile: func(string) ([]byte, error) { return doc, nil },
			})
			c, err := p.Connect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_, warned := c.Info()["warning"]
			if n := len(c.Manifest().Operations); n != tt.ops || warned != tt.warn || strings.Contains(logs.String(), "without include") != tt.warn {
				t.Fatalf("ops = %d, warning = %v, log = %s", n, c.Info()["warning"], logs.String())
			}
			if name := c.Manifest().Operations[0].Name; name != "get_things0_id" && name != "get_things1_id" {
				t.Fatalf("first name = %q", name)
			}
		})
	}
}

// BenchmarkLoad measures reading a document into operations: the test
// document, and one of 1,000 operations.
func BenchmarkLoad(b *testing.B) {
	shapes, err := os.ReadFile("testdata/shapes.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for _, doc := range []struct {
		name string
		data []byte
	}{{"shapes.yaml", shapes}, {"1000-ops.json", manyOps(1000)}} {
		b.Run(doc.name, func(b *testing.B) {
			p := New("bench", config.OpenAPI{URL: "doc"}, &Options{ReadFile: func(string) ([]byte, error) { return doc.data, nil }})
			for b.Loop() {
				if _, err := p.Connect(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
