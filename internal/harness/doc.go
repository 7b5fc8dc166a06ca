// Package harness is patchbay's engine: it owns executions — submitting
// them, the work stream and its claims, running a document node by node
// (run.go), the call path through the gates (call.go), the ledger and its
// save protocol, a model node's entries (it implements agent.Run), the
// leases runs hold, threads and waits, idempotency, once-only operations
// and traces — and it is the only package that knows an execution's Redis
// keys. The API, the admin UI, the
// triggers and cmd/server use it.
//
// Its parts are the packages beneath it, each importing only those below
// it in this list (TestImportsPointDown): agent (the model turn's loop and
// what it is made of), gates (the six gates as one Pipeline, allowlists, approvals),
// document (parsing and validating documents, values and expressions),
// registry (the named connections), refs (sealed refs), secrets (secret
// stores and the Redactor), connect (the contract providers implement;
// connecttest is its in-memory provider for tests) and fault (codes, failure
// kinds, gate numbers). The engine imports no transport and no HTTP
// framework: providers (internal/mcp, internal/openapi, …) implement
// connect.Provider and connect.Conn, and only cmd/server wires them in.
//
// # Submission, and the repair sweep
//
// An execution's record, its time-index entry and its work item are
// written by one script (submit.go), because written one after the other a
// crash between them left executions that ran but were never listed, or
// queued records no worker would ever run. The repair sweep (Repair) fixes
// what older versions (and Redis Cluster, where one script cannot span the
// keys) leave behind, at start and every RepairEvery.
//
// # Fetching work
//
// One fetcher per process reads the work stream for all its workers
// (worker.go, fetch): once a worker is idle it asks for as many items as
// workers are idle (XREADGROUP COUNT n, one consumer per process) and
// hands one to each, and it looks for abandoned items (XAUTOCLAIM) at most
// once per poll. Workers hold no Redis connection while they idle, so
// go-redis's pool (10 connections per CPU) serves the runs however many
// workers there are. An item is read only for a worker that is idle, so
// it does not wait in the process while its idle time runs towards a
// takeover. Acknowledgements are not batched: a run's last save
// acknowledges its item (see below), which costs no round trip of its own.
//
// # Takeover
//
// A run holds its execution by a claim key that lapses unless renewed
// (every third of the visibility timeout); the work item stays pending on
// the stream until the run ends or parks. A process takes over a pending
// item that has been idle for the timeout. The item's idle time and the
// claim's remaining time are different clocks: an item can come due while
// the dead runner's last renewal still holds the claim. The refused worker
// therefore sets the item's idle time (XCLAIM IDLE) so that it comes due
// again just after the claim would lapse, and a dead runner's execution is
// taken over within one timeout of its last renewal plus a poll, not up
// to two timeouts. The fetcher follows XAUTOCLAIM's cursor through the
// whole pending list, which it scans only ten entries per item asked for.
//
// # Expressions
//
// Every {"$expr"} is compiled and run by internal/sandbox
// (document/value.go), the helper trigger expressions share. Compile-time limits (4096 bytes, 2000
// nodes, brackets 64 deep) are EXPRESSION_INVALID problems at submit; an
// evaluation past its run-time limits (1,000,000 steps, 32 MiB of built
// strings and arrays, 500,000 array/map elements, 1 s) fails its step
// with a message naming the limit (*sandbox.LimitError). An expression
// sees its scope as a map; the scope also carries the context of the
// run or parallel path it belongs to (frame.ctx, set on the root frame in
// run.go and on each path's), so cancelling the execution or a path
// stops its expressions between two steps.
//
// # Notifications, and what a save writes
//
// Cancel and Wait hear their messages (cancel asked, execution finished)
// through one pattern subscription per process (notify.go), not a
// subscription, and so a Redis connection, per running execution. A
// message is only a hint: each listener also reads the state it waits for
// (the cancel flag, the record), so a message lost while the subscription
// reconnects costs time, not correctness. A save of the record, fenced by
// the run's epoch, writes the events that report it (and, when the
// execution finishes, the announcement Wait listens for) in the same
// script; a call's started event goes out with its pending entry's save.
// Every event written is also announced on the channel named like the
// execution's event stream: an EventFeed (an SSE client's stream) waits
// for that on the same subscription, which subscribes to the channel while
// someone follows it, and reads without blocking, so no waiting stream
// holds a pooled connection in a blocking XREAD.
//
// # The record and its ledger in Redis
//
// An execution is two keys under its hash tag: the record
// ({exec:ID}:record, JSON of the execution without its ledger entries:
// the head) and the ledger ({exec:ID}:ledger, a hash: one field per entry,
// named by the entry's position, holding its JSON). A step's save
// (saveScript) writes its own entry, not the whole record again, and the
// head only when it changed (a run's start, park and finish), so a call
// step costs two small scripts (its pending and its done entry) whatever
// the ledger holds. Dropping entries (a replaced connection's results run
// live again, a resume keeps only done ones) rewrites the hash whole. A
// run's saves are serialized (run.saving): each sends what changed since
// the one before, so they must reach Redis in the order they were taken,
// and a save that returns has written everything changed before it (a
// parallel path's pending entry is written before its call leaves even
// when a sibling's save carried it). Both keys live for the retention
// from the last change of the head.
//
// A worker's claim (claimRunScript) reads the head, the ledger and the
// cancel flag in the same round trip, and the run's last save (finished
// or waiting) lets go of the claim and acknowledges and deletes the work
// item in the same script (leaveScript; a run cut short releases with
// releaseAckScript and leaves its item pending; on Redis Cluster, where
// the work stream is in another slot, they go one by one). A submission
// writes its record, index entry, work item and queued event in one
// script. Durability is unchanged: every write that must precede a call
// (its pending entry) or an acknowledgement (the terminal or waiting
// record) is still fenced by the epoch and done before it.
//
// Records written before the ledger had a hash of its own hold their
// entries in the head; they load as before (decodeRecord falls back to
// them when the hash is empty), and the first save of a run over one
// writes its entries to the hash. The reverse does not hold: a version
// from before this shape reads a record written by this one without its
// entries (the head's "steps" is null), so do not run both versions on
// one Redis at once (stop the old replicas before starting new ones).
//
// # Parking, and parallel paths
//
// A run parks when a call waits for a person (an approval): the record is
// written "waiting", the worker lets go of its claim, and the decision
// enqueues the execution again; the next run replays the ledger (done
// entries return their results, failed ones their error) and continues the
// rest. Parking is not failing, so nothing it cuts short is recorded as a
// step failure, only interruptions are passed up (errWaiting, errParked,
// ErrFenced, storage errors; see interruption and run.fail).
//
// Parallel paths park independently. A path that parks cancels none of its
// siblings ("all" and "any" alike): they run on, finishing their calls
// (and asking for their own approvals), until each ends or parks too, and
// then the parallel parks. Only what could wait long stops early: a wait
// step that hears a sibling parked reads the events already there and
// returns errParked, its entry left pending with its cursor and deadline,
// so the resumed run listens again from that cursor until that same
// deadline (an event the log received by the deadline counts even when it
// is read later). Calls are not cut short, so a parked run does not leave
// calls half sent; a call cut short by the run stopping (fenced, storage)
// stays pending and is sent again with the same idempotency key. A lease
// wait is not cut short either: it is bounded by the pool's wait.
//
// Once the parallel's paths have all ended, its outcome is, in order: the
// run stopping (fenced, storage); "any"'s winner; a path's failure (in
// "all", which cancels the others as before); a park. So a failure in one
// path fails the run even while another waits for a person; that path's
// approval then leads nowhere (a decision on it finds the execution
// finished).
//
// Leases (see handles.go) follow their path: a fresh: path lease goes back as
// soon as its path ends, failed or not, unless the path parked (kept, and
// renewed, with the run) or the run stopped (kept for the run that takes
// over). So a failed parallel run holds no lease of its paths; only the
// execution's own leases of a failed run are kept for a resume. The leases
// of a parked run stay renewed by the process it parked in (parkLease);
// cancelling the parked execution gives them back at the next renewal.
//
// # once-operations
//
// A call of an operation a profile the connection speaks marks once
// (once.go) records its outcome (a result, or the tool error the server
// answered with) under <prefix>once:<hex sha256 of connection, identity
// instance, operation, idempotency key> for OnceTTL (7 days) or the
// retention when longer, after the server
// answers and before the done entry is saved; the first record wins (SET
// NX). A run that finds the entry still pending (its runner died after
// the call) reads the record before sending and, when it is there,
// answers from it, so a server that ignores idempotency keys acts once.
// The window that remains: a runner dying while the call is in flight or
// before the record is written leaves a pending entry and no record, and
// the resume sends the call again with the same key (the ledger's pending
// entry is what makes it re-sent at all; determinism is not consulted,
// since it judges done entries only). A record made against another
// identity instance does not answer: the replaced server may not hold the
// effect, and the call goes to the new one.
//
// # Threads
//
// A trigger's turn may run on a thread (threads.go): one turn open per
// thread at a time, each event on the thread seen by exactly one turn.
// Starting or joining is one script over the thread's keys; a wait of the
// open turn takes the events of its thread through another, which also
// answers for events the wait read in the log before the inbox delivered
// them; the turn's final save closes the thread, or hands it to the
// earliest event that joined and that no wait took, which starts the next
// turn. On Redis Cluster the close follows the save (other slot) and the
// inbox repeats it when it sees the turn ended.
package harness
