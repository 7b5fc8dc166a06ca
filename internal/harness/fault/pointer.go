package fault

import "strings"

// pointerEscaper is built once: building a Replacer per key was most of
// what a submission allocated.
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// Escape encodes a key for a JSON Pointer (RFC 6901).
func Escape(key string) string {
	if !strings.ContainsAny(key, "~/") {
		return key
	}
	return pointerEscaper.Replace(key)
}
