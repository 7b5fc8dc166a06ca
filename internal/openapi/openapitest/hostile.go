// Package openapitest makes hostile OpenAPI documents for tests: small
// documents whose schemas blow up when inlined, documents with huge
// strings, deep nesting or wide flat bodies. Every document is JSON with
// servers[0].url set, so it loads from a file as from a URL.
package openapitest

import (
	"fmt"
	"strings"
)

// FanOutOp is the operation of FanOut's documents: POST /things, whose
// body is S0.
const FanOutOp = "fanout"

// PingOp is an operation with a one-parameter input every document here
// also has, to show the rest of a hostile document still works.
const PingOp = "ping"

func open(b *strings.Builder) {
	b.WriteString(`{"openapi":"3.0.3","info":{"title":"hostile","version":"1"},"servers":[{"url":"http://127.0.0.1:9/api"}],"paths":{`)
	b.WriteString(`"/ping":{"get":{"operationId":"` + PingOp + `","parameters":[{"name":"q","in":"query","schema":{"type":"string"}}],"responses":{"200":{"description":"ok"}}}}`)
}

// FanOut is a document whose schemas S0…S(levels-1) each have width
// properties p0…p(width-1) that $ref the next, down to S(levels): a
// string with a description of descBytes bytes. Inlined, the body of
// FanOutOp holds width^levels copies of that string.
func FanOut(levels, width, descBytes int) []byte {
	var b strings.Builder
	open(&b)
	b.WriteString(`,"/things":{"post":{"operationId":"` + FanOutOp + `","requestBody":{"required":true,"content":{"application/json":{"schema":{"$ref":"#/components/schemas/S0"}}}},"responses":{"200":{"description":"ok"}}}}`)
	b.WriteString(`},"components":{"schemas":{`)
	for l := range levels {
		fmt.Fprintf(&b, `"S%d":{"type":"object","properties":{`, l)
		for i := range width {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"p%d":{"$ref":"#/components/schemas/S%d"}`, i, l+1)
		}
		b.WriteString(`}},`)
	}
	fmt.Fprintf(&b, `"S%d":{"type":"string","description":"%s"}}}}`, levels, strings.Repeat("d", descBytes))
	return []byte(b.String())
}

// DeepOp is the operation of Deep's documents.
const DeepOp = "deep"

// Deep is a document whose DeepOp body nests objects levels deep, inline
// (no refs): {"properties": {"a": {"properties": {"a": …}}}}.
func Deep(levels int) []byte {
	var b strings.Builder
	open(&b)
	b.WriteString(`,"/deep":{"post":{"operationId":"` + DeepOp + `","requestBody":{"content":{"application/json":{"schema":`)
	for range levels {
		b.WriteString(`{"type":"object","properties":{"a":`)
	}
	b.WriteString(`{"type":"string"}`)
	for range levels {
		b.WriteString(`}}`)
	}
	b.WriteString(`}}},"responses":{"200":{"description":"ok"}}}}}}`)
	return []byte(b.String())
}

// FlatOp is the operation of Flat's documents.
const FlatOp = "flat"

// Flat is a document whose FlatOp body has props distinct properties
// f0…f(props-1), each its own small schema: nothing in it repeats, so its
// compile cost cannot be shared away.
func Flat(props int) []byte {
	var b strings.Builder
	open(&b)
	b.WriteString(`,"/flat":{"post":{"operationId":"` + FlatOp + `","requestBody":{"content":{"application/json":{"schema":{"type":"object","properties":{`)
	for i := range props {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"f%d":{"type":"integer","minimum":%d}`, i, i)
	}
	b.WriteString(`}}}}},"responses":{"200":{"description":"ok"}}}}}}`)
	return []byte(b.String())
}

// NestedArgs is an argument object for FanOut's operation, levels deep:
// {"p0": {"p0": … "x"}}.
func NestedArgs(levels int) map[string]any {
	var v any = "x"
	for range levels {
		v = map[string]any{"p0": v}
	}
	return v.(map[string]any)
}
