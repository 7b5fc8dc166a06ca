package seal_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/seal"
)

func box(t *testing.T, key byte, purpose string) *seal.Box {
	t.Helper()
	b, err := seal.New(bytes.Repeat([]byte{key}, 32), "", purpose, "label\x00")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTripAndBinding(t *testing.T) {
	a := box(t, 1, "purpose a")
	sealed, err := a.Seal("tok:alice", map[string]string{"token": "s3cret-value"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, "s3cret") || !strings.HasPrefix(sealed, "v1:"+a.KeyID()+":") {
		t.Fatalf("sealed = %q", sealed)
	}
	var got map[string]string
	if err := a.Open("tok:alice", sealed, &got); err != nil || got["token"] != "s3cret-value" {
		t.Fatalf("Open = %v %v", got, err)
	}
	for name, tc := range map[string]struct {
		box  *seal.Box
		name string
	}{
		"another name":    {a, "tok:bob"},
		"another purpose": {box(t, 1, "purpose b"), "tok:alice"},
	} {
		if err := tc.box.Open(tc.name, sealed, &got); !errors.Is(err, seal.ErrKeyMismatch) {
			t.Errorf("%s: Open = %v, want ErrKeyMismatch", name, err)
		}
	}
	if err := a.Open("tok:alice", "v1:"+a.KeyID()+":!!", &got); err == nil || errors.Is(err, seal.ErrKeyMismatch) {
		t.Errorf("garbage: Open = %v, want an unknown-format error", err)
	}
}

func TestNewRefusesBadKeys(t *testing.T) {
	if _, err := seal.New(make([]byte, 31), "", "p", "l"); !errors.Is(err, seal.ErrKeySize) {
		t.Errorf("short key: %v", err)
	}
	if _, err := seal.New(make([]byte, 32), "bad id!", "p", "l"); err == nil {
		t.Error("bad key id accepted")
	}
}
