package pools

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// # Process trees of leased connections
//
// A leased connection's server (and what it starts: a browser) is a
// process tree on the host of the process that provisioned it, named by
// a proctree tag the provider picks before provisioning and passes down
// in the context (the mcp provider puts it in the child's environment).
// Closing the connection ends the tree (internal/mcp). What a crash
// leaves is swept from a record per tree in the hash {pool:NAME}:procs,
// tag -> {lease, owner, at}, written before the server starts and deleted
// once it is closed. Every provider, in every replica, sweeps the hash at
// Connect and every RefreshEvery (1 s):
//   - a tree whose owner ran on this host (same boot and pid namespace)
//     and is no longer running (its pid is gone or was reused) is ended,
//     and its record deleted: a killed holder's browser goes within a
//     tick once any replica on its host (or its restart) sweeps, whether
//     or not its lease has been reclaimed yet (the connection went with
//     its process, so a resume provisions a new one either way);
//   - a tree of this process that it no longer has (a record left by a
//     failed delete) is ended and deleted;
//   - a lease this process keeps for a parked run, for which another live
//     process has since provisioned a connection (the run resumed there),
//     has its connection closed here: the lease stays, the other's
//     browser serves it;
//   - a record of another host is left to that host's processes, and
//     dropped after procRecordTTL (its host is gone, or would have swept
//     it by then).
// A tree can only be ended from its own host: with replicas on several
// hosts, a holder that dies on a host where no replica runs again leaves
// its tree to the kernel (Pdeathsig kills its server; a browser exits
// when its server's pipe closes).

// procRecordTTL is how long a record of another host's tree is kept.
const procRecordTTL = 24 * time.Hour

// treeKillWait bounds how long a sweep keeps killing one tree.
const treeKillWait = 2 * time.Second

// procRecord is one process tree in the procs hash.
type procRecord struct {
	Lease string         `json:"lease"`
	Owner proctree.Owner `json:"owner"`
	At    int64          `json:"at"` // unix ms when written
}

// recording reports whether trees are recorded here: only where they can
// be found again (Linux).
func (pr *Provider) recording() bool { return proctree.Supported() && pr.owner.Host != "" }

// track picks the tag of lease's new connection and records it, before
// the server starts; at is when.
func (pr *Provider) track(ctx context.Context, lease *Lease) (tag string, at int64) {
	tag, at = proctree.NewTag(), time.Now().UnixMilli()
	pr.mu.Lock()
	pr.tags[tag] = lease.ID
	pr.mu.Unlock()
	if !pr.recording() {
		return tag, at
	}
	rec, _ := json.Marshal(procRecord{Lease: lease.ID, Owner: pr.owner, At: at})
	if err := pr.pool.st.Client.HSet(context.WithoutCancel(ctx), pr.procs, tag, rec).Err(); err != nil {
		// The server still starts; only a crash of this process would
		// leave its tree unswept.
		pr.logger.Warn("recording a leased connection's process tree", "pool", pr.pool.name, "lease", lease.ID, "err", err)
	}
	return tag, at
}

// untrack forgets a closed connection's tree.
func (pr *Provider) untrack(tag string) {
	if pr.recording() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := pr.pool.st.Client.HDel(ctx, pr.procs, tag).Err(); err != nil {
			pr.logger.Warn("forgetting a closed connection's process tree; the sweep will", "pool", pr.pool.name, "err", err)
		}
		cancel()
	}
	pr.mu.Lock()
	delete(pr.tags, tag)
	pr.mu.Unlock()
}

// renewWhile renews lease every renewEvery until the returned function is
// called, which reports whether the lease was found reclaimed meanwhile.
func (pr *Provider) renewWhile(lease *Lease) (stop func() (lost bool)) {
	done := make(chan struct{})
	var gone atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(pr.renewEvery())
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := pr.pool.Renew(ctx, lease)
			cancel()
			if errors.Is(err, ErrStaleLease) {
				gone.Store(true)
				return
			}
		}
	})
	return func() bool {
		close(done)
		wg.Wait()
		return gone.Load()
	}
}

// sweep ends the process trees the hash says nobody alive holds, and the
// kept connections of leases another process took over (see above).
func (pr *Provider) sweep(ctx context.Context) {
	if !pr.recording() {
		return
	}
	recs, err := pr.pool.st.Client.HGetAll(ctx, pr.procs).Result()
	if err != nil {
		return // the next tick tries again
	}
	for tag, raw := range recs {
		var rec procRecord
		if json.Unmarshal([]byte(raw), &rec) != nil {
			pr.pool.st.Client.HDel(ctx, pr.procs, tag)
			continue
		}
		switch {
		case rec.Owner.Host != pr.owner.Host:
			if time.Since(time.UnixMilli(rec.At)) > procRecordTTL {
				pr.pool.st.Client.HDel(ctx, pr.procs, tag)
			}
		case rec.Owner == pr.owner:
			pr.mu.Lock()
			_, mine := pr.tags[tag]
			pr.mu.Unlock()
			if !mine {
				pr.end(ctx, tag, rec, "a process tree this process no longer holds")
			}
		case !proctree.Alive(rec.Owner):
			pr.end(ctx, tag, rec, "the process tree of a holder that died")
		default:
			pr.handedOver(rec)
		}
	}
}

// end kills a recorded tree and deletes its record.
func (pr *Provider) end(ctx context.Context, tag string, rec procRecord, why string) {
	n, err := proctree.Kill(tag, treeKillWait)
	if err != nil {
		pr.logger.Warn("ending "+why, "pool", pr.pool.name, "lease", rec.Lease, "owner", rec.Owner.String(), "err", err)
		return // kept for the next sweep
	}
	if n > 0 {
		pr.logger.Info("ended "+why, "pool", pr.pool.name, "lease", rec.Lease, "owner", rec.Owner.String(), "processes", n)
	}
	pr.pool.st.Client.HDel(ctx, pr.procs, tag)
}

// handedOver closes this process's connection of a lease it keeps for a
// parked run when rec, another live process's tree, is a newer connection
// of the same lease: the run resumed there, and the lease is that
// process's to renew and give back.
func (pr *Provider) handedOver(rec procRecord) {
	pr.mu.Lock()
	l := pr.live[rec.Lease]
	pr.mu.Unlock()
	if l == nil || !l.kept.Load() || rec.At <= l.at {
		return
	}
	pr.logger.Info("kept lease resumed by another process; closing its connection here", "pool", pr.pool.name, "lease", rec.Lease, "owner", rec.Owner.String())
	l.drop()
}
