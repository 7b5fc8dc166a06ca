package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// PoolStatusFor is st as p may see it. A lease's holder names an
// execution, which belongs to the principal that started it: a principal
// without read sees its own leases' holders and, for everyone else's, only
// that a slot is held (slot and ages, no holder). st itself is not
// changed: it is shared by every request. Owners are read with one
// pipelined round trip, one record per execution holding a lease (at most
// the pool's max); when they cannot be read, no holder is shown.
func (e *Executions) PoolStatusFor(ctx context.Context, st *connect.PoolStatus, p authz.Principal) *connect.PoolStatus {
	if st == nil || p.SeesAll() || len(st.Leases) == 0 {
		return st
	}
	out := *st
	out.Leases = slices.Clone(st.Leases)
	ids := make([]string, 0, len(out.Leases))
	for _, l := range out.Leases {
		ids = append(ids, holderExecution(l.Holder))
	}
	owners, err := e.owners(ctx, ids)
	if err != nil {
		e.logger.WarnContext(ctx, "pool status: lease holders hidden: their owners could not be read", "err", err)
	}
	for i, l := range out.Leases {
		owner, known := owners[holderExecution(l.Holder)]
		if !known || !p.Sees(owner) {
			out.Leases[i].Holder = ""
		}
	}
	return &out
}

// holderExecution is the execution a lease holder names: the holder is
// "<execution>/<handle>", plus the parallel path for fresh: path.
func holderExecution(holder string) string {
	id, _, _ := strings.Cut(holder, "/")
	return id
}

// owners reads the principal of each execution that still exists; an
// execution that is gone has no entry.
func (e *Executions) owners(ctx context.Context, ids []string) (map[string]string, error) {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	heads := make([]*redis.StringCmd, len(ids))
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			heads[i] = p.Get(ctx, e.recordKey(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("executions: read owners: %w", err)
	}
	out := make(map[string]string, len(ids))
	for i, cmd := range heads {
		data, err := cmd.Bytes()
		if err != nil {
			continue
		}
		var head struct {
			Principal string `json:"principal"`
		}
		if json.Unmarshal(data, &head) == nil {
			out[ids[i]] = head.Principal
		}
	}
	return out, nil
}
