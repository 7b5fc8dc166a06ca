package refs_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

var baseRC = refs.RefContext{
	Thread:     "th_1",
	Connection: "app",
	Identity:   connect.Identity{Surface: "web", Instance: "browser-1", Epoch: 1},
}

// tokenPayload decodes the payload of a token, for tests that look inside
// or forge one.
func tokenPayload(t *testing.T, token string) map[string]any {
	t.Helper()
	body := strings.TrimPrefix(token, "pbr1.")
	enc, _, _ := strings.Cut(body, ".")
	data, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// reforge returns token with its payload edited and the old MAC kept.
func reforge(t *testing.T, token string, edit func(map[string]any)) string {
	t.Helper()
	m := tokenPayload(t, token)
	edit(m)
	data, _ := json.Marshal(m)
	_, mac, _ := strings.Cut(strings.TrimPrefix(token, "pbr1."), ".")
	return "pbr1." + base64.RawURLEncoding.EncodeToString(data) + "." + mac
}

func sealRef(t *testing.T, s *refs.Sealer, raw, kind string, volatile bool, rc refs.RefContext) string {
	t.Helper()
	tok, err := s.Seal(t.Context(), raw, kind, volatile, rc)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSealOpen(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		s := refs.NewSealer(st)
		leased := baseRC
		leased.Lease = "lease-1"
		element := sealRef(t, s, "e12", "element", true, baseRC)
		thread := sealRef(t, s, "C0123", "thread", false, baseRC)
		onLease := sealRef(t, s, "e7", "element", true, leased)

		// A token from another deployment (its own keys, same key id).
		other := refs.NewSealer(storetest.NewEmbedded(t))
		foreign := sealRef(t, other, "e12", "element", true, baseRC)
		if _, err := other.Rotate(t.Context()); err != nil {
			t.Fatal(err)
		}
		foreignK2 := sealRef(t, other, "e12", "element", true, baseRC)

		with := func(edit func(*refs.RefContext)) refs.RefContext {
			rc := baseRC
			edit(&rc)
			return rc
		}
		tests := []struct {
			name  string
			token string
			rc    refs.RefContext
			raw   string
			err   error
		}{
			{name: "same context", token: element, rc: baseRC, raw: "e12"},
			{name: "epoch change keeps volatile refs", token: element, rc: with(func(rc *refs.RefContext) { rc.Identity.Epoch = 9 }), raw: "e12"},
			{name: "routing left to caller", token: element, rc: with(func(rc *refs.RefContext) { rc.Connection = "" }), raw: "e12"},
			{name: "instance replaced, volatile", token: element, rc: with(func(rc *refs.RefContext) { rc.Identity.Instance = "browser-2" }), err: refs.ErrRefStale},
			{name: "surface changed, volatile", token: element, rc: with(func(rc *refs.RefContext) { rc.Identity.Surface = "ios" }), err: refs.ErrRefStale},
			{name: "instance replaced, not volatile", token: thread, rc: with(func(rc *refs.RefContext) { rc.Identity.Instance = "browser-2" }), raw: "C0123"},
			{name: "other thread", token: element, rc: with(func(rc *refs.RefContext) { rc.Thread = "th_2" }), err: refs.ErrRefThread},
			{name: "other thread, not volatile", token: thread, rc: with(func(rc *refs.RefContext) { rc.Thread = "" }), err: refs.ErrRefThread},
			{name: "other connection", token: thread, rc: with(func(rc *refs.RefContext) { rc.Connection = "chat" }), err: refs.ErrRefRoute},
			{name: "same lease", token: onLease, rc: leased, raw: "e7"},
			{name: "other lease", token: onLease, rc: with(func(rc *refs.RefContext) { rc.Lease = "lease-2" }), err: refs.ErrRefLease},
			{name: "leased ref without lease", token: onLease, rc: baseRC, err: refs.ErrRefLease},
			{name: "unleased ref on a lease", token: element, rc: leased, err: refs.ErrRefLease},
			{name: "raw id changed", token: reforge(t, element, func(m map[string]any) { m["r"] = "e13" }), rc: baseRC, err: refs.ErrRefForged},
			{name: "connection changed", token: reforge(t, thread, func(m map[string]any) { m["c"] = "chat" }), rc: with(func(rc *refs.RefContext) { rc.Connection = "chat" }), err: refs.ErrRefForged},
			{name: "volatile flag dropped", token: reforge(t, element, func(m map[string]any) { delete(m, "v"); delete(m, "i") }), rc: baseRC, err: refs.ErrRefForged},
			{name: "thread digest swapped", token: reforge(t, element, func(m map[string]any) { m["t"] = tokenPayload(t, thread)["t"].(string) + "x" }), rc: baseRC, err: refs.ErrRefForged},
			{name: "mac changed", token: element[:len(element)-2] + "AA", rc: baseRC, err: refs.ErrRefForged},
			{name: "mac missing", token: element[:strings.LastIndex(element, ".")], rc: baseRC, err: refs.ErrRefForged},
			{name: "no prefix", token: strings.TrimPrefix(element, "pbr1."), rc: baseRC, err: refs.ErrRefForged},
			{name: "raw id as token", token: "e12", rc: baseRC, err: refs.ErrRefForged},
			{name: "empty", token: "", rc: baseRC, err: refs.ErrRefForged},
			{name: "garbage", token: "pbr1.!!!.???", rc: baseRC, err: refs.ErrRefForged},
			{name: "payload not an object", token: "pbr1." + base64.RawURLEncoding.EncodeToString([]byte(`[1]`)) + ".AAAA", rc: baseRC, err: refs.ErrRefForged},
			{name: "huge", token: "pbr1." + strings.Repeat("A", 1<<16) + ".AAAA", rc: baseRC, err: refs.ErrRefForged},
			{name: "other deployment, same key id", token: foreign, rc: baseRC, err: refs.ErrRefForged},
			{name: "unknown key id", token: foreignK2, rc: baseRC, err: refs.ErrRefKeyUnknown},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				ref, err := s.Open(t.Context(), tt.token, tt.rc)
				if tt.err != nil {
					var re *refs.RefError
					if !errors.Is(err, tt.err) || !errors.As(err, &re) {
						t.Fatalf("Open = %+v, %v; want %v", ref, err, tt.err)
					}
					return
				}
				if err != nil || ref.Raw != tt.raw || ref.Connection != "app" || ref.KeyID != "k1" {
					t.Fatalf("Open = %+v, %v; want raw %s from app", ref, err, tt.raw)
				}
			})
		}

		ref, err := s.Open(t.Context(), element, baseRC)
		if err != nil || !ref.Volatile || ref.Kind != "element" {
			t.Errorf("Open = %+v, %v", ref, err)
		}
		var re *refs.RefError
		if _, err := s.Open(t.Context(), thread, with(func(rc *refs.RefContext) { rc.Connection = "chat" })); !errors.As(err, &re) || re.Connection != "app" || !strings.Contains(err.Error(), "(app)") {
			t.Errorf("routing refusal = %v", err)
		}

		// The token shows nothing of the thread, lease or identity.
		for _, tok := range []string{element, onLease} {
			data, _ := json.Marshal(tokenPayload(t, tok))
			for _, hidden := range []string{"th_1", "lease-1", "browser-1"} {
				if strings.Contains(string(data), hidden) {
					t.Errorf("token payload %s shows %q", data, hidden)
				}
			}
		}
	})
}

func TestSealBadInput(t *testing.T) {
	t.Parallel()
	s := refs.NewSealer(storetest.NewEmbedded(t))
	noConn := baseRC
	noConn.Connection = ""
	for name, call := range map[string]func() (string, error){
		"empty ref":     func() (string, error) { return s.Seal(t.Context(), "", "element", false, baseRC) },
		"no connection": func() (string, error) { return s.Seal(t.Context(), "e1", "element", false, noConn) },
		"too long": func() (string, error) {
			return s.Seal(t.Context(), strings.Repeat("e", refs.MaxRawRefLen+1), "x", false, baseRC)
		},
	} {
		if tok, err := call(); err == nil {
			t.Errorf("%s: Seal = %q", name, tok)
		}
	}
	// The longest raw id still opens.
	long := strings.Repeat("é", refs.MaxRawRefLen/2)
	tok := sealRef(t, s, long, "url", false, baseRC)
	if ref, err := s.Open(t.Context(), tok, baseRC); err != nil || ref.Raw != long {
		t.Errorf("Open(long) = %v", err)
	}
}

// Replicas starting at once on an empty store agree on one first key:
// whatever any of them seals, all of them open.
func TestSealerReplicasAgree(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		const n = 8
		sealers := make([]*refs.Sealer, n)
		tokens := make([]string, n)
		for i := range sealers {
			sealers[i] = refs.NewSealer(st)
		}
		var wg sync.WaitGroup
		for i, s := range sealers {
			wg.Go(func() {
				tok, err := s.Seal(t.Context(), "e1", "element", true, baseRC)
				if err != nil {
					t.Error(err)
				}
				tokens[i] = tok
			})
		}
		wg.Wait()
		for _, s := range sealers {
			for _, tok := range tokens {
				if _, err := s.Open(t.Context(), tok, baseRC); err != nil {
					t.Fatalf("a replica refuses another's ref: %v", err)
				}
			}
		}
		if n, err := st.Client.HLen(t.Context(), st.Key("refkeys")).Result(); err != nil || n != 2 {
			t.Fatalf("refkeys has %d fields (%v), want k1 and current", n, err)
		}
	})
}

// Keys live in Redis, not in the process: a Sealer made after the first is
// gone (a restart) opens the first one's refs. On a real Redis the new
// Sealer also comes with a new connection, as after a process restart.
func TestSealerKeysSurviveRestart(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		tok := sealRef(t, refs.NewSealer(st), "e1", "element", true, baseRC)

		again := st
		if !st.Embedded() {
			var err error
			again, err = store.Open(context.Background(), storetest.URL(t), st.Prefix, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = again.Close() })
		}
		if ref, err := refs.NewSealer(again).Open(t.Context(), tok, baseRC); err != nil || ref.Raw != "e1" {
			t.Fatalf("after restart: %+v, %v", ref, err)
		}
	})
}

func TestSealerRotate(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		ctx := t.Context()
		a, b := refs.NewSealer(st), refs.NewSealer(st)
		old := sealRef(t, a, "e1", "element", false, baseRC)
		if _, err := b.Open(ctx, old, baseRC); err != nil { // b has loaded k1
			t.Fatal(err)
		}
		id, err := a.Rotate(ctx)
		if err != nil || id != "k2" {
			t.Fatalf("Rotate = %q, %v", id, err)
		}
		fresh := sealRef(t, a, "e2", "element", false, baseRC)
		if k := tokenPayload(t, fresh)["k"]; k != "k2" {
			t.Fatalf("sealed after Rotate with %v", k)
		}
		// b learns k2 the moment it meets it, and still opens k1 refs.
		for _, tok := range []string{old, fresh} {
			if _, err := b.Open(ctx, tok, baseRC); err != nil {
				t.Fatalf("b.Open: %v", err)
			}
		}
		// Replicas rotating at once lose no key: each ends on a key that
		// is (or was) current, and the last one is current everywhere.
		c, d := refs.NewSealer(st), refs.NewSealer(st)
		ids := make([]string, 2)
		var wg sync.WaitGroup
		for i, s := range []*refs.Sealer{c, d} {
			wg.Go(func() {
				id, err := s.Rotate(ctx)
				if err != nil {
					t.Error(err)
				}
				ids[i] = id
			})
		}
		wg.Wait()
		fields, err := st.Client.HGetAll(ctx, st.Key("refkeys")).Result()
		if err != nil {
			t.Fatal(err)
		}
		last := max(ids[0], ids[1])
		if fields["current"] != last || fields[ids[0]] == "" || fields[ids[1]] == "" || len(fields) != len(ids)+3-refBoolInt(ids[0] == ids[1]) {
			t.Fatalf("racing rotations %v left %d fields, current %s", ids, len(fields), fields["current"])
		}
		for _, tok := range []string{old, fresh} {
			if _, err := c.Open(ctx, tok, baseRC); err != nil {
				t.Fatalf("retired key no longer verifies: %v", err)
			}
		}
	})
}

func TestSealRefsAndOpenRefs(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		ctx := t.Context()
		s := refs.NewSealer(st)
		result := map[string]any{
			"snapshot": []any{
				map[string]any{"$ref": "e1", "kind": "element", "volatile": true, "role": "button", "name": "Submit"},
				map[string]any{"$ref": "e2", "kind": "element"},
			},
			"window": map[string]any{"$ref": "w1", "kind": "window", "volatile": false},
			"schema": map[string]any{"$ref": "#/defs/x"}, // no kind: not a ref
			"title":  "Checkout",
		}
		before, _ := json.Marshal(result)
		sealedAny, err := s.SealRefs(ctx, result, baseRC)
		if err != nil {
			t.Fatal(err)
		}
		if after, _ := json.Marshal(result); string(after) != string(before) {
			t.Fatal("SealRefs changed its input")
		}
		sealed := sealedAny.(map[string]any)
		e1 := sealed["snapshot"].([]any)[0].(map[string]any)
		e2 := sealed["snapshot"].([]any)[1].(map[string]any)
		w1 := sealed["window"].(map[string]any)
		for _, ref := range []map[string]any{e1, e2, w1} {
			tok, _ := ref["$ref"].(string)
			if !refs.IsSealedRef(tok) || ref["volatile"] != nil || ref["kind"] == nil {
				t.Fatalf("sealed ref = %v", ref)
			}
		}
		if e1["role"] != "button" || e1["name"] != "Submit" || len(e2) != 2 {
			t.Errorf("sealed refs lost or gained keys: %v %v", e1, e2)
		}
		if !reflect.DeepEqual(sealed["schema"], result["schema"]) || sealed["title"] != "Checkout" {
			t.Errorf("non-refs changed: %v", sealed)
		}

		// A model passes refs back: whole objects or just the $ref.
		args := map[string]any{
			"element": e1,
			"targets": []any{map[string]any{"$ref": e2["$ref"]}},
			"window":  map[string]any{"$ref": w1["$ref"], "kind": "window"},
			"schema":  map[string]any{"$ref": "#/defs/y", "type": "object"},
			"text":    "hello",
		}
		opened, got, err := s.OpenRefs(ctx, args, baseRC)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]any{
			"element": "e1",
			"targets": []any{"e2"},
			"window":  "w1",
			"schema":  map[string]any{"$ref": "#/defs/y", "type": "object"},
			"text":    "hello",
		}
		if !reflect.DeepEqual(opened, want) {
			t.Fatalf("OpenRefs = %v, want %v", opened, want)
		}
		var raws []string
		for _, r := range got {
			if r.Connection != "app" {
				t.Errorf("ref %+v not from app", r)
			}
			raws = append(raws, r.Raw)
		}
		if strings.Join(raws, ",") != "e1,e2,w1" {
			t.Errorf("refs in order = %v", raws)
		}

		// Refusals name where the ref was.
		otherThread := baseRC
		otherThread.Thread = "th_2"
		tests := []struct {
			name string
			args any
			rc   refs.RefContext
			err  error
			path string
		}{
			{"raw id in a ref object", map[string]any{"a": []any{map[string]any{"$ref": "e1"}}}, baseRC, refs.ErrRefForged, "/a/0"},
			{"raw id with kind", map[string]any{"x/y": map[string]any{"$ref": "e1", "kind": "element"}}, baseRC, refs.ErrRefForged, "/x~1y"},
			{"forged token", map[string]any{"el": map[string]any{"$ref": "pbr1.abc.def"}}, baseRC, refs.ErrRefForged, "/el"},
			{"other thread", map[string]any{"el": e1}, otherThread, refs.ErrRefThread, "/el"},
			{"other connection", []any{e2}, refs.RefContext{Thread: "th_1", Connection: "chat"}, refs.ErrRefRoute, "/0"},
			{"at the root", map[string]any{"$ref": "e1"}, baseRC, refs.ErrRefForged, "/"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				out, got, err := s.OpenRefs(t.Context(), tt.args, tt.rc)
				var re *refs.RefError
				if !errors.Is(err, tt.err) || !errors.As(err, &re) || re.Path != tt.path || out != nil || got != nil {
					t.Fatalf("OpenRefs = %v, %v, %v; want %v at %s", out, got, err, tt.err, tt.path)
				}
				if !strings.Contains(err.Error(), tt.path) {
					t.Errorf("message %q lacks the path", err)
				}
			})
		}

		// Typed results are read as JSON; a bad volatile flag is an error.
		type elem struct {
			Ref  string `json:"$ref"`
			Kind string `json:"kind"`
		}
		typed, err := s.SealRefs(ctx, []elem{{"e9", "element"}}, baseRC)
		if err != nil || !refs.IsSealedRef(typed.([]any)[0].(map[string]any)["$ref"].(string)) {
			t.Errorf("typed SealRefs = %v, %v", typed, err)
		}
		if _, err := s.SealRefs(ctx, map[string]any{"x": map[string]any{"$ref": "e1", "kind": "k", "volatile": "yes"}}, baseRC); err == nil || !strings.Contains(err.Error(), "/x") {
			t.Errorf("bad volatile: %v", err)
		}
	})
}

func TestWithholdSensitive(t *testing.T) {
	t.Parallel()
	const withheld = "[sensitive blob withheld]"
	tests := []struct {
		name string
		in   any
		want any
	}{
		{"sensitive blob", map[string]any{"$blob": "b_1", "sensitive": true}, withheld},
		{"nested", map[string]any{"session": map[string]any{"$blob": map[string]any{"id": "b"}, "sensitive": true, "size": 3.0}, "k": "v"},
			map[string]any{"session": withheld, "k": "v"}},
		{"in a list", []any{1.0, map[string]any{"$blob": "b", "sensitive": true}}, []any{1.0, withheld}},
		{"not sensitive", map[string]any{"$blob": "b", "sensitive": false}, map[string]any{"$blob": "b", "sensitive": false}},
		{"sensitive but no blob", map[string]any{"sensitive": true}, map[string]any{"sensitive": true}},
		{"sensitive as a string", map[string]any{"$blob": "b", "sensitive": "true"}, map[string]any{"$blob": "b", "sensitive": "true"}},
		{"scalar", "text", "text"},
		{"typed", []map[string]any{{"$blob": "b", "sensitive": true}}, []any{withheld}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := refs.WithholdSensitive(tt.in); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("WithholdSensitive = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func refBoolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
