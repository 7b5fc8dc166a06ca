package refs

import (
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// A rotation that lost the race (the current key is no longer the one it
// saw) makes no key and reports the winner's.
func TestRotateScriptLosesRace(t *testing.T) {
	t.Parallel()
	st := storetest.NewEmbedded(t)
	s := NewSealer(st)
	if _, err := s.Rotate(t.Context()); err != nil { // k1, then k2
		t.Fatal(err)
	}
	id, err := rotateScript.Run(t.Context(), st.Client, []string{s.hashKey()}, "k1", "k2", "AAAA").Text()
	if err != nil || id != "k2" {
		t.Fatalf("stale rotation = %q, %v", id, err)
	}
	fields, _ := st.Client.HGetAll(t.Context(), s.hashKey()).Result()
	if len(fields) != 3 || fields["k2"] == "AAAA" {
		t.Fatalf("stale rotation changed the keys: %v", fields)
	}
}

// A replica keeps sealing with the key it knows until refKeysTTL has
// passed, then picks up a rotation made elsewhere.
func TestSealerPicksUpRotation(t *testing.T) {
	t.Parallel()
	st := storetest.NewEmbedded(t)
	now := time.Unix(1000, 0)
	b := NewSealer(st)
	b.now = func() time.Time { return now }
	rc := RefContext{Thread: "t", Connection: "c"}
	if _, err := b.Seal(t.Context(), "e1", "k", false, rc); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSealer(st).Rotate(t.Context()); err != nil {
		t.Fatal(err)
	}
	keyOf := func() string {
		t.Helper()
		tok, err := b.Seal(t.Context(), "e1", "k", false, rc)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := b.Open(t.Context(), tok, rc)
		if err != nil {
			t.Fatal(err)
		}
		return ref.KeyID
	}
	if k := keyOf(); k != "k1" {
		t.Fatalf("before the TTL: sealed with %s", k)
	}
	now = now.Add(refKeysTTL)
	if k := keyOf(); k != "k2" {
		t.Fatalf("after the TTL: sealed with %s", k)
	}
}
