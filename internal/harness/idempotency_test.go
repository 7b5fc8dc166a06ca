package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

func idemKey(key, fp string) harness.IdempotencyKey {
	return harness.IdempotencyKey{Principal: "tester", Scope: "POST /v1/executions", Key: key, Fingerprint: fp}
}

// recordTTL is the TTL of the one idempotency record under st's prefix.
func recordTTL(t *testing.T, st *store.Store) time.Duration {
	t.Helper()
	keys, err := st.Client.Keys(t.Context(), st.Prefix+"{idem:*}:rec").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("idempotency records = %v, %v; want one", keys, err)
	}
	ttl, err := st.Client.PTTL(t.Context(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	return ttl
}

func TestIdempotencyClaim(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		ctx := t.Context()
		idem := harness.NewIdempotency(st)

		first, err := idem.Claim(ctx, idemKey("k1", "fp"), "ex_first")
		if err != nil || first.State != harness.ClaimNew || first.ID != "ex_first" {
			t.Fatalf("first claim = %+v, %v", first, err)
		}
		if ttl := recordTTL(t, st); ttl < 23*time.Hour || ttl > harness.IdempotencyTTL {
			t.Errorf("record TTL = %s, want 24h", ttl)
		}
		for _, tc := range []struct {
			name string
			key  harness.IdempotencyKey
			want error
		}{
			{"same key in flight", idemKey("k1", "fp"), harness.ErrIdempotencyInFlight},
			{"same key, other body", idemKey("k1", "other"), harness.ErrIdempotencyMismatch},
		} {
			if _, err := idem.Claim(ctx, tc.key, "ex_second"); !errors.Is(err, tc.want) {
				t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
			}
		}
		other := idemKey("k1", "fp")
		other.Principal = "someone else"
		if c, err := idem.Claim(ctx, other, "ex_theirs"); err != nil || c.State != harness.ClaimNew || c.ID != "ex_theirs" {
			t.Errorf("another principal's claim = %+v, %v; want its own", c, err)
		}

		if err := idem.Complete(ctx, first, "saved"); err != nil {
			t.Fatal(err)
		}
		done, err := idem.Claim(ctx, idemKey("k1", "fp"), "ex_third")
		if err != nil || done.State != harness.ClaimDone || done.ID != "ex_first" || done.Result != "saved" {
			t.Errorf("claim after complete = %+v, %v", done, err)
		}
	})
}

func TestIdempotencyReleaseAndForget(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		ctx := t.Context()
		idem := harness.NewIdempotency(st)

		// Released: the next request resumes under the same id.
		c, _ := idem.Claim(ctx, idemKey("rel", "fp"), "ex_kept")
		if err := idem.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
		again, err := idem.Claim(ctx, idemKey("rel", "fp"), "ex_new")
		if err != nil || again.State != harness.ClaimResumed || again.ID != "ex_kept" {
			t.Errorf("after release = %+v, %v; want resumed ex_kept", again, err)
		}

		// Forgotten: the key is free, even for another body.
		c, _ = idem.Claim(ctx, idemKey("fgt", "fp"), "ex_gone")
		if err := idem.Forget(ctx, c); err != nil {
			t.Fatal(err)
		}
		fresh, err := idem.Claim(ctx, idemKey("fgt", "corrected"), "ex_new")
		if err != nil || fresh.State != harness.ClaimNew || fresh.ID != "ex_new" {
			t.Errorf("after forget = %+v, %v; want new ex_new", fresh, err)
		}
	})
}

// TestSubmitIdempotentAfterCrash: a submitter that died after its claim —
// before or after writing the execution — leaves a key whose lock lapses;
// the retry then submits at most once, under the reserved id.
func TestSubmitIdempotentAfterCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		diedAfterSave bool
	}{
		{"died before submitting", false},
		{"died after submitting", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := storetest.NewEmbedded(t) // FastForward
			b := setup(t, st)
			ctx := t.Context()
			k := idemKey("crash", "fp")
			claim, err := b.execs.Idempotency().Claim(ctx, k, "ex_reserved")
			if err != nil {
				t.Fatal(err)
			}
			if tc.diedAfterSave {
				if _, err := b.execs.Submit(ctx, request(threeCalls, claim.ID)); err != nil {
					t.Fatal(err)
				}
			}
			// While the lock holds, a retry is told to wait.
			if _, _, err := b.execs.SubmitIdempotent(ctx, k, nil); !errors.Is(err, harness.ErrIdempotencyInFlight) {
				t.Fatalf("retry in flight: err = %v", err)
			}
			st.Miniredis().FastForward(11 * time.Second)

			calls := 0
			ex, replayed, err := b.execs.SubmitIdempotent(ctx, k, func(ctx context.Context, id string) (*harness.Execution, error) {
				calls++
				return b.execs.Submit(ctx, request(threeCalls, id))
			})
			if err != nil || ex.ID != "ex_reserved" {
				t.Fatalf("retry = %v, %v; want ex_reserved", ex, err)
			}
			if wantCalls := map[bool]int{false: 1, true: 0}[tc.diedAfterSave]; calls != wantCalls || replayed != tc.diedAfterSave {
				t.Errorf("submit called %d times, replayed %v; want %d, %v", calls, replayed, wantCalls, tc.diedAfterSave)
			}
			waitDone(t, b.execs, ex.ID)
			again, replayed, err := b.execs.SubmitIdempotent(ctx, k, nil)
			if err != nil || !replayed || again.ID != ex.ID {
				t.Errorf("replay = %v, %v, %v", again, replayed, err)
			}
		})
	}
}

// TestSubmitIdempotentRefused: a document refused before anything is
// written frees its key, so the corrected request may use it.
func TestSubmitIdempotentRefused(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	b := setup(t, st)
	ctx := t.Context()
	bad := `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"nope"}}`
	_, _, err := b.execs.SubmitIdempotent(ctx, idemKey("fix", "bad"), func(ctx context.Context, id string) (*harness.Execution, error) {
		return b.execs.Submit(ctx, request(bad, id))
	})
	var ve *fault.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("bad document: err = %v", err)
	}
	ex, replayed, err := b.execs.SubmitIdempotent(ctx, idemKey("fix", "good"), func(ctx context.Context, id string) (*harness.Execution, error) {
		return b.execs.Submit(ctx, request(threeCalls, id))
	})
	if err != nil || replayed || !strings.HasPrefix(ex.ID, "ex_") {
		t.Fatalf("corrected request = %v, %v, %v", ex, replayed, err)
	}
}

func request(doc, id string) harness.Request {
	return harness.Request{Workflow: json.RawMessage(doc), Input: map[string]any{"x": 1}, Principal: "tester", Allowlist: "test", ID: id}
}

func waitDone(t *testing.T, execs *harness.Executions, id string) {
	t.Helper()
	ex, err := execs.Wait(t.Context(), id, 10*time.Second)
	if err != nil || !ex.Status.Terminal() {
		t.Fatalf("execution %s = %v, %v; want it finished", id, ex, err)
	}
}

// A release or completion that Redis refuses (a failover under way) is
// retried once Redis answers again, so a client's retry is not told the
// key is in flight until the lock lapses by itself.
func TestIdempotencySettlesOnceTheStoreIsBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		settle func(ctx context.Context, idem *harness.Idempotency, c *harness.Claim) error
		want   harness.ClaimState
	}{
		{"release", func(ctx context.Context, idem *harness.Idempotency, c *harness.Claim) error {
			return idem.Release(ctx, c)
		}, harness.ClaimResumed},
		{"complete", func(ctx context.Context, idem *harness.Idempotency, c *harness.Claim) error {
			return idem.Complete(ctx, c, "saved")
		}, harness.ClaimDone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			m := miniredis.RunT(t)
			st := openSmallPool(t, "redis://"+m.Addr(), 2, "")
			idem := harness.NewIdempotency(st)
			c, err := idem.Claim(ctx, idemKey("k", "fp"), "ex_first")
			if err != nil {
				t.Fatal(err)
			}
			m.SetError("ERR injected: the store is failing over")
			if err := tc.settle(ctx, idem, c); err == nil {
				t.Fatal("settled while the store refuses every command")
			}
			m.SetError("")
			// The lock would stand 10 s; the retry drops it well before.
			deadline := time.Now().Add(5 * time.Second)
			for {
				again, err := idem.Claim(ctx, idemKey("k", "fp"), "ex_second")
				if err == nil {
					if again.State != tc.want || again.ID != "ex_first" {
						t.Fatalf("claim after the store came back = %+v, want state %v of ex_first", again, tc.want)
					}
					return
				}
				if !errors.Is(err, harness.ErrIdempotencyInFlight) || time.Now().After(deadline) {
					t.Fatalf("claim after the store came back: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
