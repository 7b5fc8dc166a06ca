package githubapp_test

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// BenchmarkTokenCached is the cost of a call whose token is cached: one
// Redis GET and one AES-GCM open.
func BenchmarkTokenCached(b *testing.B) {
	gh := newFake(b, newClock(), "")
	r := newReplica(b, gh, storetest.New(b))
	if _, err := r.src.Token(b.Context(), widgets); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.src.Token(b.Context(), widgets); err != nil {
			b.Fatal(err)
		}
	}
}
