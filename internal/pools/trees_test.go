//go:build linux

package pools

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/proctree"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// treeConn is a leased connection whose "server" is a real process tree
// tagged with the tag its provisioning context carried: a sleeper in a
// session of its own, as a browser would be. Close ends the tree.
type treeConn struct {
	*connecttest.Memory
	tag    string
	closed *atomic.Int64
}

func (c *treeConn) Close() error {
	c.closed.Add(1)
	_, err := proctree.Kill(c.tag, 2*time.Second)
	return err
}

// startTagged starts a sleeper in a session of its own carrying tag.
func startTagged(t *testing.T, tag string) int {
	t.Helper()
	cmd := exec.Command("setsid", "sleep", "300")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), proctree.Env(tag)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) })
	return cmd.Process.Pid
}

// treeFake provisions treeConns and remembers the tags it was given.
type treeFake struct {
	t      *testing.T
	closed atomic.Int64
	tags   chan string
	delay  time.Duration
}

func (f *treeFake) provision(ctx context.Context, _ map[string]any) (connect.Conn, error) {
	tag := proctree.TagFrom(ctx)
	if tag == "" {
		return nil, errors.New("no process tree tag in the provisioning context")
	}
	startTagged(f.t, tag)
	time.Sleep(f.delay)
	select {
	case f.tags <- tag:
	default:
	}
	return &treeConn{Memory: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "ping"}}), tag: tag, closed: &f.closed}, nil
}

func treeProvider(t *testing.T, st *store.Store, opts *Options, delay time.Duration) (*Provider, *treeFake) {
	t.Helper()
	f := &treeFake{t: t, tags: make(chan string, 16), delay: delay}
	p, err := New(st, "browsers", 2, opts)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := NewProvider(p, ProviderOptions{Wait: 5 * time.Second, Provision: f.provision, RefreshEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	face, err := pr.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = face.Close() })
	<-f.tags // the probe's
	return pr, f
}

func records(t *testing.T, pr *Provider) map[string]procRecord {
	t.Helper()
	raw, err := pr.pool.st.Client.HGetAll(t.Context(), pr.procs).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]procRecord{}
	for tag, v := range raw {
		var rec procRecord
		if err := json.Unmarshal([]byte(v), &rec); err != nil {
			t.Fatalf("record %s: %v", tag, err)
		}
		out[tag] = rec
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func treeLeft(tag string) bool {
	procs, _ := proctree.Find(tag)
	return len(procs) > 0
}

// TestLeaseTreeRecordedUntilReleased: a lease's connection is provisioned
// with a tag recorded (this process, this lease) before the server
// starts; releasing the lease ends the tree and deletes the record.
func TestLeaseTreeRecordedUntilReleased(t *testing.T) {
	t.Parallel()
	pr, f := treeProvider(t, storetest.New(t), nil, 0)
	ctx := t.Context()
	l, err := pr.Lease(ctx, connect.LeaseRequest{Holder: "ex1/browser"})
	if err != nil {
		t.Fatal(err)
	}
	tag := <-f.tags
	recs := records(t, pr)
	if rec, ok := recs[tag]; !ok || rec.Lease != l.Record().ID || rec.Owner != proctree.Self() || len(recs) != 1 {
		t.Fatalf("records %+v: want one for tag %s, lease %s, owned by this process", recs, tag, l.Record().ID)
	}
	if !treeLeft(tag) {
		t.Fatal("the lease's tree is not running")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if treeLeft(tag) {
		t.Error("the tree is still running after Release")
	}
	if recs := records(t, pr); len(recs) != 0 {
		t.Errorf("records left after Release: %+v", recs)
	}
}

// TestSweepEndsTreesOfDeadHolders: records left by holders that died on
// this host have their trees ended and are deleted; a live holder's, and
// another host's recent one, are left alone; another host's old one is
// dropped.
func TestSweepEndsTreesOfDeadHolders(t *testing.T) {
	t.Parallel()
	pr, _ := treeProvider(t, storetest.New(t), nil, 0)
	self := proctree.Self()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	liveTag := proctree.NewTag()
	live := startTagged(t, liveTag) // stands for another live replica
	put := func(tag string, rec procRecord) {
		data, _ := json.Marshal(rec)
		if err := pr.pool.st.Client.HSet(t.Context(), pr.procs, tag, data).Err(); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UnixMilli()
	orphan, reused, farOld, farNew := proctree.NewTag(), proctree.NewTag(), proctree.NewTag(), proctree.NewTag()
	startTagged(t, orphan)
	startTagged(t, reused)
	put(orphan, procRecord{Lease: "l1", Owner: proctree.Owner{Host: self.Host, PID: dead.Process.Pid, Start: 1}, At: now})
	// This pid, started at another time: a holder whose pid was reused.
	put(reused, procRecord{Lease: "l2", Owner: proctree.Owner{Host: self.Host, PID: self.PID, Start: self.Start + 1}, At: now})
	put(liveTag, procRecord{Lease: "l3", Owner: proctree.Owner{Host: self.Host, PID: live, Start: startOf(t, live)}, At: now})
	put(farOld, procRecord{Lease: "l4", Owner: proctree.Owner{Host: "elsewhere", PID: 1, Start: 1}, At: now - (procRecordTTL + time.Hour).Milliseconds()})
	put(farNew, procRecord{Lease: "l5", Owner: proctree.Owner{Host: "elsewhere", PID: 1, Start: 1}, At: now})

	eventually(t, "the sweep", func() bool {
		recs := records(t, pr)
		_, a := recs[orphan]
		_, b := recs[reused]
		_, c := recs[farOld]
		return !a && !b && !c
	})
	for _, tag := range []string{orphan, reused} {
		if treeLeft(tag) {
			t.Errorf("the tree of a dead holder (%s) is still running", tag)
		}
	}
	recs := records(t, pr)
	if _, ok := recs[liveTag]; !ok || !treeLeft(liveTag) {
		t.Error("a live holder's tree was swept")
	}
	if _, ok := recs[farNew]; !ok {
		t.Error("another host's recent record was dropped")
	}
}

// startOf is a process's start time in clock ticks since boot.
func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(stat), ')')
	v, err := strconv.ParseUint(strings.Fields(string(stat[i+1:]))[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestKeptLeaseResumedElsewhereClosesHere: a lease kept for a parked run
// in one process is taken back by another (the run resumed there), which
// provisions its own connection; the first closes its connection at its
// next sweep, and the lease stays with the second.
func TestKeptLeaseResumedElsewhereClosesHere(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	first, f1 := treeProvider(t, st, nil, 0)
	second, f2 := treeProvider(t, st, nil, 0)
	// Another process: same host, another live pid.
	other := startTagged(t, proctree.NewTag())
	second.owner = proctree.Owner{Host: first.owner.Host, PID: other, Start: startOf(t, other)}

	ctx := t.Context()
	l, err := first.Lease(ctx, connect.LeaseRequest{Holder: "ex1/browser"})
	if err != nil {
		t.Fatal(err)
	}
	firstTag := <-f1.tags
	l.Keep()
	time.Sleep(5 * time.Millisecond) // records are ordered by their millisecond
	rec := l.Record()
	l2, err := second.Lease(ctx, connect.LeaseRequest{Holder: "ex1/browser", Resume: &rec})
	if err != nil {
		t.Fatal(err)
	}
	secondTag := <-f2.tags
	if l2.Record().ID != rec.ID {
		t.Fatalf("resumed lease %s, want %s taken back", l2.Record().ID, rec.ID)
	}
	eventually(t, "the first process to close its kept connection", func() bool { return !treeLeft(firstTag) })
	// Each also closed its probe at Connect.
	if f1.closed.Load() != 2 || f2.closed.Load() != 1 || !treeLeft(secondTag) {
		t.Errorf("closed %d here, %d there (probes included); second tree running %v", f1.closed.Load(), f2.closed.Load(), treeLeft(secondTag))
	}
	if err := first.pool.Check(ctx, &Lease{ID: rec.ID, Slot: rec.Slot, Token: rec.Token}); err != nil {
		t.Errorf("the lease was given back: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if treeLeft(secondTag) {
		t.Error("the second tree is still running after Release")
	}
}

// TestLeaseRenewedWhileItsServerStarts: a server that takes longer to
// start than the reclaim window does not lose its lease meanwhile.
func TestLeaseRenewedWhileItsServerStarts(t *testing.T) {
	t.Parallel()
	pr, _ := treeProvider(t, storetest.New(t), &Options{ReclaimAfter: 400 * time.Millisecond}, time.Second)
	l, err := pr.Lease(t.Context(), connect.LeaseRequest{Holder: "ex1/browser"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.WithoutCancel(t.Context()))
	if _, err := l.Conn().Call(t.Context(), connect.CallRequest{Op: "ping"}); err != nil {
		t.Fatalf("first call after a slow start: %v", err)
	}
}
