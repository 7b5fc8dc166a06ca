package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// Watch renews the pool leases 2025-era sessions hold across their
// calls, and tells them when the tools their caller is offered
// change — a connection added, gone or back, an allowlist edited — with
// notifications/tools/list_changed on the session's stream, checking every
// Options.ListCheck until ctx ends. (2026-era clients have no stream to
// tell: their tools/list answers carry cache hints of no caching, so
// each list is fresh.) Reading a caller's tools costs one allowlist read,
// once per caller per check however many sessions it has.
func (s *Server) Watch(ctx context.Context) {
	t := time.NewTicker(s.o.ListCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.checkLists(ctx)
		}
	}
}

func (s *Server) checkLists(ctx context.Context) {
	digests := map[string]string{} // principal → digest of its tool names
	for id, p := range s.sessions.live() {
		s.o.Engine.RenewHeld(ctx, sessionScope(p.Name, id))
		d, ok := digests[p.Name]
		if !ok {
			var err error
			if d, err = s.toolDigest(ctx, p); err != nil {
				s.o.Logger.Warn("mcp: tool list check", "principal", p.Name, "err", err)
				continue
			}
			digests[p.Name] = d
		}
		if s.sessions.offered(id, d) {
			_ = s.mcp.SendNotificationToSpecificClient(id, "notifications/tools/list_changed", nil)
		}
	}
}

func (s *Server) toolDigest(ctx context.Context, p authz.Principal) (string, error) {
	offer, err := s.o.Engine.Tools(ctx, harness.ToolCaller{Principal: p.Name, Allowlist: p.Allowlist})
	if err != nil {
		return "", err
	}
	tools := offer.List()
	var b strings.Builder
	for _, t := range tools {
		b.WriteString(t.Name)
		b.WriteByte(0)
		b.Write(t.InputSchema)
		b.WriteByte(0)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8]), nil
}
