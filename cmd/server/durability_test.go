package main

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// What the kill tests check beyond exactly-once effects: every execution
// is listed, no queued execution is left without a work item, and how long
// a killed runner's executions stalled before another replica took them
// over.

// listedIDs pages through GET /v1/executions with key and returns every
// id listed.
func listedIDs(t *testing.T, addr, key string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	cursor := ""
	for range 10_000 {
		path := "/v1/executions?limit=100"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		status, page := get2(addr, key, path)
		if status != 200 {
			t.Fatalf("GET %s: %d %v", path, status, page)
		}
		items, _ := page["items"].([]any)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				ids[m["id"].(string)] = true
			}
		}
		next, _ := page["next"].(string)
		if next == "" {
			return ids
		}
		cursor = next
	}
	t.Fatal("GET /v1/executions did not end")
	return nil
}

// recordHead is what the checks read of a stored execution record.
type recordHead struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// allRecords reads the id and status of every execution record under
// prefix.
func allRecords(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string) []recordHead {
	t.Helper()
	return records(t, ctx, c, prefix, func(recordHead) bool { return true })
}

// records decodes every execution record under prefix as a T and keeps
// those keep accepts. A record that expires during the scan is skipped.
func records[T any](t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string, keep func(T) bool) []T {
	t.Helper()
	var out []T
	for _, k := range scanKeys(t, ctx, c, prefix+"{exec:*}:record") {
		data, err := c.Get(ctx, k).Bytes()
		if err != nil {
			continue
		}
		var r T
		if json.Unmarshal(data, &r) == nil && keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// scanKeys returns the keys matching match, on every master of a cluster.
func scanKeys(t *testing.T, ctx context.Context, c redis.UniversalClient, match string) []string {
	t.Helper()
	var (
		mu  sync.Mutex
		out []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			out = append(out, keys...)
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// orphanedQueued returns the queued records that have no item on the work
// stream: executions no worker would ever run.
func orphanedQueued(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string, recs []recordHead) []string {
	t.Helper()
	msgs, err := c.XRange(ctx, prefix+"work", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	queued := map[string]bool{}
	for _, m := range msgs {
		if id, ok := m.Values["id"].(string); ok {
			queued[id] = true
		}
	}
	var out []string
	for _, r := range recs {
		if r.Status == "queued" && !queued[r.ID] {
			out = append(out, r.ID)
		}
	}
	return out
}

// takeoverLatencies returns, for every run that took an execution over
// (a running state at epoch 2 or more), how long the execution had made
// no progress: from its previous event (the last thing the killed runner
// did) to the new run's start. Event ids are Redis stream ids, so both
// times are the Redis server's.
func takeoverLatencies(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string, ids []string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, id := range ids {
		evs, err := c.XRange(ctx, prefix+"{exec:"+id+"}:events", "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Values["type"] != "execution.state" {
				continue
			}
			var data struct {
				Status string `json:"status"`
				Epoch  int64  `json:"epoch"`
			}
			raw, _ := evs[i].Values["data"].(string)
			if json.Unmarshal([]byte(raw), &data) != nil || data.Status != "running" || data.Epoch < 2 {
				continue
			}
			out = append(out, streamTime(evs[i].ID).Sub(streamTime(evs[i-1].ID)))
		}
	}
	return out
}

func streamTime(id string) time.Time {
	ms, _ := strconv.ParseInt(id[:strings.IndexByte(id, '-')], 10, 64)
	return time.UnixMilli(ms)
}

// medianMax returns the median and the maximum of ds (zero for none).
func medianMax(ds []time.Duration) (median, maximum time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)-1]
}

// checkListedAndQueued fails t for an execution record that GET
// /v1/executions (with a key that sees them) does not list, or a queued
// one without a work item, and reports both counts.
func checkListedAndQueued(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix, addr, key string) (unlisted, orphaned int) {
	t.Helper()
	recs := allRecords(t, ctx, c, prefix)
	listed := listedIDs(t, addr, key)
	for _, r := range recs {
		if !listed[r.ID] {
			unlisted++
			t.Errorf("execution %s (%s) is not listed by GET /v1/executions", r.ID, r.Status)
		}
	}
	for _, id := range orphanedQueued(t, ctx, c, prefix, recs) {
		orphaned++
		t.Errorf("execution %s is queued with no work item", id)
	}
	return unlisted, orphaned
}
