// Package triggers owns what brings events in and turns them into turns:
// sources (events pushed by host code or posted as signed webhooks), cron
// sources (one tick per scheduled time), the events of MCP servers
// (streamed or polled: mcpevents.go, mcppush.go), the triggers of the
// config file, and the durable inbox in Redis between them.
//
// # Exactly one execution per event
//
// An event is ingested by one Lua script that, together: drops it when its
// id (or webhook-id) was seen within the dedupe window or, for cron, when
// its slot is not after the watermark; remembers the id; appends one inbox
// entry per matching trigger; advances the cursor; counts it and logs the
// delivery. Entries are read through a consumer group. For each entry the
// reading replica calls Executions.SubmitOnce with the message id
// "<connection>:<trigger>:<event id>", so however often an entry is
// delivered — a crash, a reclaim, a redelivery from the dead-letter list —
// it names one execution. The entry is acknowledged (and deleted) only
// when that execution is terminal. While it waits, the replica renews its
// claim on the entries it holds (XCLAIM JUSTID, which leaves the delivery
// count alone); entries of a replica that stopped renewing for
// ReclaimAfter are claimed by another, in batches and until none is left,
// so the backlog of a replica killed during a burst is taken over in one
// pass (a thousand entries in well under a second on a local Redis)
// rather than a hundred per half ReclaimAfter. An entry claimed more than
// MaxDeliveries times, or one that can never succeed (an input expression
// that fails, a workflow that does not validate), goes to the connection's
// dead-letter hash, from which the API can redeliver it.
//
// # Threads
//
// An entry whose trigger puts its event on a thread (the trigger's thread
// expression, or the natural thread of a profile its connection speaks)
// goes through harness.SubmitOnThread instead: one script decides whether
// the event starts a turn or joins the one open on the thread, once, so a
// redelivered entry finds the same answer. The entry then stays with its
// event until a turn has seen it: when the turn it joined ends without a
// wait taking the event, the event starts the next turn (or joins it),
// and the entry follows. It is done with the outcome of the turn that saw
// its event. Where each entry went ("started" or "joined", and the
// execution) is kept under {in:C}:turns:<event id> for the dedupe window,
// and shown with the delivery log and the dead letters. An entry
// dead-lettered after opening a turn it never wrote lets the thread go
// (harness.AbandonTurn), so the events that joined it start the next.
//
// # Keys
//
// Every key of one connection's inbox shares the hash tag {in:<name>}, so
// the ingest script works on Redis Cluster.
//
//	{in:C}:stream   inbox entries (fields t: trigger id, e: event JSON)
//	{in:C}:seen:ID  a seen event id, until the dedupe window ends
//	{in:C}:wh:ID    a seen webhook-id
//	{in:C}:state    counters, cursor (cron watermark, Unix ms), lastEventAt
//	{in:C}:log      the last LogSize deliveries, newest first (JSON)
//	{in:C}:dead     dead letters by entry id (JSON)
//	{in:C}:turns:ID where each entry of event ID went, by trigger
//	                ("started:<execution>" or "joined:<execution>")
//	{in:C}:sub:ID   an MCP event subscription: cursor, mode, figures and,
//	                for webhook delivery, the server's id and refreshBefore
//	{in:C}:sub:ID:whsec  its sealed webhook secrets (current, previous)
//	{in:C}:hooks    the server's webhook subscription ids → ours
//
// # Cron
//
// A cron connection's slots are evaluated in civil time of its zone. Every
// replica runs the schedule; each slot is ingested with the slot as its
// cursor and the script refuses a slot that is not after the watermark, so
// a slot fires once across replicas with no leader. Slots missed while no
// replica ran are caught up per the connection's policy (all, at most
// MaxCatchUp of the latest; latest; none). Daylight saving: a slot that
// falls in the spring-forward gap fires once at the moment the clocks jump
// (slots that collapse onto the same instant fire once); a slot in the
// repeated autumn hour fires once, at its first occurrence.
package triggers
