package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

const echoDoc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"c","connection":"mem","op":"echo","args":{"x":1}}}`

// newSubmitExecutions returns executions over a registry with one memory
// connection "mem", with no workers running.
func newSubmitExecutions(t *testing.T, st *store.Store) *Executions {
	t.Helper()
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	return NewExecutions(st, reg, &ExecutionsOptions{Visibility: time.Second})
}

// stage is how far the old two-step submission got before its process
// died: the record alone, or the record and its index entry (the
// pipelined second step is not atomic either).
type stage int

const (
	recordOnly stage = iota
	recordIndexed
	recordIndexedQueued // what a whole submission leaves
)

// oldSubmit writes an execution the way the two-step path did, stopping
// at the given crash point.
func oldSubmit(t *testing.T, e *Executions, id string, status ExecState, created time.Time, at stage) {
	t.Helper()
	ctx := t.Context()
	rec := &record{Execution: Execution{ID: id, Status: status, Steps: []StepRecord{}, CreatedAt: created, Principal: HostPrincipal},
		Workflow: json.RawMessage(echoDoc)}
	data, err := marshalRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Client.Set(ctx, e.recordKey(id), data, e.retention).Err(); err != nil {
		t.Fatal(err)
	}
	if at >= recordIndexed {
		if err := e.store.Client.ZAdd(ctx, e.indexKey(), redisZ(indexMember(created, id))).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if at >= recordIndexedQueued {
		if err := e.resume(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// state is what Redis holds about one execution.
type state struct {
	record, indexed bool
	items           int
}

func stateOf(t *testing.T, e *Executions, id string) state {
	t.Helper()
	ctx := t.Context()
	var s state
	n, err := e.store.Client.Exists(ctx, e.recordKey(id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	s.record = n == 1
	members, err := e.store.Client.ZRange(ctx, e.indexKey(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	s.indexed = slices.ContainsFunc(members, func(m string) bool { return m[len(m)-len(id):] == id })
	msgs, err := e.store.Client.XRange(ctx, e.workKey(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Values["id"] == id {
			s.items++
		}
	}
	return s
}

// The submit script writes the record, its index entry and its work item
// together, or nothing: a record that exists already stops it before any
// write, and so does a shared key that a later write would fail on.
func TestSubmitScriptWritesAllOrNothing(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		cases := []struct {
			name    string
			prepare func(e *Executions, id string)
			fresh   bool
			wantErr bool
			want    state
		}{
			{name: "new", fresh: true, want: state{record: true, indexed: true, items: 1}},
			{name: "record exists", prepare: func(e *Executions, id string) {
				must(t, e.store.Client.Set(t.Context(), e.recordKey(id), "{}", 0).Err())
			}, want: state{record: true}},
			{name: "work stream of the wrong type", prepare: func(e *Executions, id string) {
				must(t, e.store.Client.Set(t.Context(), e.workKey(), "x", 0).Err())
			}, wantErr: true, want: state{}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				// Each case on a prefix of its own: they break shared keys.
				sub := &store.Store{Client: st.Client, Prefix: st.Prefix + tc.name + ":"}
				e := newSubmitExecutions(t, sub)
				id := newExecutionID()
				if tc.prepare != nil {
					tc.prepare(e, id)
				}
				fresh, _, err := e.write(t.Context(), id, []byte(`{"id":"`+id+`"}`), indexMember(time.Now(), id))
				if (err != nil) != tc.wantErr || fresh != tc.fresh {
					t.Fatalf("write = %v, %v; want fresh %v, error %v", fresh, err, tc.fresh, tc.wantErr)
				}
				if tc.wantErr {
					must(t, e.store.Client.Del(t.Context(), e.workKey()).Err()) // so stateOf can read it
				}
				if got := stateOf(t, e, id); got != tc.want {
					t.Fatalf("after write: %+v, want %+v", got, tc.want)
				}
				// Run again (go-redis retries a script): nothing more.
				if !tc.wantErr {
					if fresh, _, err := e.write(t.Context(), id, []byte(`{}`), indexMember(time.Now(), id)); err != nil || fresh {
						t.Fatalf("second write = %v, %v", fresh, err)
					}
					if got := stateOf(t, e, id); got != tc.want {
						t.Fatalf("after a second write: %+v, want %+v", got, tc.want)
					}
				}
			})
		}
		for _, tc := range cases { // the shared keys of the cases
			_ = st.Client.Del(context.Background(), st.Key(tc.name, "executions"), st.Key(tc.name, "work"))
		}
	})
}

// The repair sweep finds what the old two-step submission left at each of
// its crash points, fixes exactly that, and finds nothing the second time.
func TestRepairFixesEachCrashPointOfTheTwoStepSubmit(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		e := newSubmitExecutions(t, st)
		old := time.Now().Add(-time.Minute).UTC()
		cases := []struct {
			name    string
			status  ExecState
			created time.Time
			at      stage
			want    state
		}{
			{"queued, record only", ExecQueued, old, recordOnly, state{true, true, 1}},
			{"queued, indexed, no item", ExecQueued, old, recordIndexed, state{true, true, 1}},
			{"queued, whole", ExecQueued, old, recordIndexedQueued, state{true, true, 1}},
			{"running, record only", ExecRunning, old, recordOnly, state{true, true, 0}},
			{"succeeded, record only", ExecSucceeded, old, recordOnly, state{true, true, 0}},
			// Within the grace period a submission may still be writing
			// its item: indexed, not queued a second time.
			{"queued just now, record only", ExecQueued, time.Now().UTC(), recordOnly, state{true, true, 0}},
		}
		ids := make([]string, len(cases))
		for i, tc := range cases {
			ids[i] = newExecutionID()
			oldSubmit(t, e, ids[i], tc.status, tc.created, tc.at)
		}
		rep, err := e.Repair(t.Context())
		must(t, err)
		if want := (RepairReport{Records: 6, Indexed: 4, Requeued: 2}); rep != want {
			t.Errorf("first sweep = %+v, want %+v", rep, want)
		}
		for i, tc := range cases {
			if got := stateOf(t, e, ids[i]); got != tc.want {
				t.Errorf("%s: after the sweep %+v, want %+v", tc.name, got, tc.want)
			}
		}
		rep, err = e.Repair(t.Context())
		must(t, err)
		if want := (RepairReport{Records: 6}); rep != want {
			t.Errorf("second sweep = %+v, want %+v", rep, want)
		}
	})
}

// An execution left by a process that died between the record and the
// rest runs once workers start (they sweep at start), and is listed.
func TestRepairedExecutionRunsAndIsListed(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		e := newSubmitExecutions(t, st)
		id := newExecutionID()
		oldSubmit(t, e, id, ExecQueued, time.Now().Add(-time.Minute).UTC(), recordOnly)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = e.Run(ctx, 1); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		ex, err := e.Wait(t.Context(), id, 10*time.Second)
		must(t, err)
		if ex.Status != ExecSucceeded {
			t.Fatalf("status = %s %+v", ex.Status, ex.Error)
		}
		page, err := e.List(t.Context(), ListOptions{})
		must(t, err)
		if len(page.Items) != 1 || page.Items[0].ID != id {
			t.Fatalf("listed = %+v", page.Items)
		}
	})
}

// SubmitOnce of an event whose message was claimed by a process that died
// before the rest (or by an older version that wrote the record alone, or
// the record and its index entry) yields the claimed execution, whole:
// written under the claimed id when there is no record yet.
func TestSubmitOnceAfterEachCrashPoint(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		e := newSubmitExecutions(t, st)
		cases := []struct {
			name    string
			at      stage
			record  bool // the dead process wrote the record (up to at)
			created bool
		}{
			{"claimed, nothing written", 0, false, true},
			{"claimed, record only", recordOnly, true, false},
			{"claimed, record indexed, no item", recordIndexed, true, false},
		}
		for i, tc := range cases {
			key := fmt.Sprintf("hooks:t:ev-%d", i)
			id := newExecutionID()
			must(t, e.store.Client.Set(t.Context(), e.store.Key("msg", key), id, 0).Err())
			if tc.record {
				oldSubmit(t, e, id, ExecQueued, time.Now().UTC(), tc.at)
			}
			ex, created, err := e.SubmitOnce(t.Context(), key, json.RawMessage(echoDoc), map[string]any{})
			must(t, err)
			if ex.ID != id || created != tc.created {
				t.Errorf("%s: SubmitOnce = %s, created %v; want %s, created %v", tc.name, ex.ID, created, id, tc.created)
			}
			if got, want := stateOf(t, e, id), (state{true, true, 1}); got != want {
				t.Errorf("%s: after SubmitOnce %+v, want %+v", tc.name, got, want)
			}
		}
	})
}

// A retried idempotent submit whose first attempt died after the record
// (an older version) returns that execution, made whole.
func TestIdempotentRetryMakesAnOldRecordWhole(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		e := newSubmitExecutions(t, st)
		k := IdempotencyKey{Principal: "p", Scope: "POST /v1/executions", Key: "k1", Fingerprint: "f"}
		c, err := e.Idempotency().Claim(t.Context(), k, newExecutionID())
		must(t, err)
		oldSubmit(t, e, c.ID, ExecQueued, time.Now().UTC(), recordOnly)
		must(t, e.Idempotency().Release(t.Context(), c)) // the first attempt ends uncompleted
		ex, _, err := e.SubmitIdempotent(t.Context(), k, func(ctx context.Context, id string) (*Execution, error) {
			return nil, errors.New("submit must not run: the execution exists")
		})
		must(t, err)
		if ex.ID != c.ID {
			t.Fatalf("retry = %s, want %s", ex.ID, c.ID)
		}
		if got, want := stateOf(t, e, c.ID), (state{true, true, 1}); got != want {
			t.Fatalf("after the retry: %+v, want %+v", got, want)
		}
	})
}

func redisZ(member string) redis.Z { return redis.Z{Member: member} }
