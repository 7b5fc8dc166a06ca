package harness

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// notifier is this process's one subscription to the executions' cancel
// and done channels. A subscription holds a Redis connection of its own,
// so one per running execution (cancel) and one per waiting request
// (Wait) cost two new connections per execution; one pattern
// subscription, opened on first use and kept for the life of the store's
// client, serves them all, and a dispatcher hands each message to the
// listeners of its channel.
//
// Messages are hints, never the only signal: a subscription that drops
// (and go-redis reconnects) loses what was published meanwhile, so every
// listener also reads the state it waits for (the cancel flag, the
// record), as it did with its own subscription.
type notifier struct {
	client   redis.UniversalClient
	patterns []string

	start sync.Once
	// ready is closed once the subscription is confirmed (or failed to
	// be): a listener registered after that hears every later message.
	ready chan struct{}

	mu        sync.Mutex
	listeners map[string]map[chan struct{}]struct{}
}

// subscribeWait bounds how long a listener waits for the shared
// subscription to be confirmed: a slow Redis must not hold up a run, and
// the listener's own read of the state backs the message up.
const subscribeWait = 2 * time.Second

func newNotifier(client redis.UniversalClient, patterns ...string) *notifier {
	return &notifier{client: client, patterns: patterns, ready: make(chan struct{}), listeners: map[string]map[chan struct{}]struct{}{}}
}

func (n *notifier) run() {
	ctx := context.Background()
	ps := n.client.PSubscribe(ctx, n.patterns...)
	confirm, cancel := context.WithTimeout(ctx, subscribeWait)
	_, _ = ps.Receive(confirm)
	cancel()
	close(n.ready)
	// Channel reconnects and subscribes again after an error; it is
	// closed when the client is.
	for msg := range ps.Channel() {
		n.mu.Lock()
		for ch := range n.listeners[msg.Channel] {
			select {
			case ch <- struct{}{}:
			default: // one pending signal is enough
			}
		}
		n.mu.Unlock()
	}
}

// listen returns a channel that receives a signal for each message on
// channel (at most one pending), and stop to unregister it. It returns
// once the shared subscription is confirmed (or after subscribeWait), so
// a caller that reads the state after listen misses nothing.
func (n *notifier) listen(ctx context.Context, channel string) (<-chan struct{}, func()) {
	n.start.Do(func() { go n.run() })
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	if n.listeners[channel] == nil {
		n.listeners[channel] = map[chan struct{}]struct{}{}
	}
	n.listeners[channel][ch] = struct{}{}
	n.mu.Unlock()
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-n.ready:
	case <-ctx.Done():
	case <-t.C:
	}
	stop := func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.listeners[channel], ch)
		if len(n.listeners[channel]) == 0 {
			delete(n.listeners, channel)
		}
	}
	return ch, stop
}
