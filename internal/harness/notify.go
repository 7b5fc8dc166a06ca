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
//
// Channels outside the patterns (an execution's events) are subscribed
// on the same connection one by one while someone watches them (watch),
// so a replica hears the events of the executions it streams and no
// others. Their listeners are woken again when go-redis re-subscribes
// after a reconnect, since messages may have been lost in between.
type notifier struct {
	client   redis.UniversalClient
	patterns []string

	start sync.Once
	// ready is closed once the subscription is confirmed (or failed to
	// be): a listener registered after that hears every later message.
	ready chan struct{}

	// watching orders the SUBSCRIBE and UNSUBSCRIBE commands of watched
	// channels as their listener counts change, so that a channel
	// watched again just after its last watcher left is not left
	// unsubscribed.
	watching sync.Mutex

	// ps is the subscription, made (without a round trip) on first use.
	ps *redis.PubSub

	mu        sync.Mutex
	listeners map[string]map[chan struct{}]struct{}
	// pending counts the SUBSCRIBEs of each watched channel that Redis
	// has not confirmed yet; confirmed[ch] is closed when they all are.
	pending   map[string]int
	confirmed map[string]chan struct{}
}

// subscribeWait bounds how long a listener waits for the shared
// subscription to be confirmed: a slow Redis must not hold up a run, and
// the listener's own read of the state backs the message up.
const subscribeWait = 2 * time.Second

func newNotifier(client redis.UniversalClient, patterns ...string) *notifier {
	return &notifier{
		client: client, patterns: patterns, ready: make(chan struct{}),
		listeners: map[string]map[chan struct{}]struct{}{}, pending: map[string]int{}, confirmed: map[string]chan struct{}{},
	}
}

// open makes the subscription and starts run; once.
func (n *notifier) open() {
	// No patterns yet: go-redis connects on the first command, which run
	// sends.
	n.ps = n.client.PSubscribe(context.Background())
	go n.run(n.ps)
}

func (n *notifier) run(ps *redis.PubSub) {
	ctx := context.Background()
	_ = ps.PSubscribe(ctx, n.patterns...) // on failure, Receive reconnects
	confirm, cancel := context.WithTimeout(ctx, subscribeWait)
	_, _ = ps.Receive(confirm)
	cancel()
	close(n.ready)
	// The channel reconnects and subscribes again after an error; it is
	// closed when the client is. Subscription confirmations come through
	// it too: watch waits for them.
	for msg := range ps.ChannelWithSubscriptions() {
		switch m := msg.(type) {
		case *redis.Message:
			n.signal(m.Channel)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				n.subscribed(m.Channel)
			}
		}
	}
}

// signal wakes the listeners of channel.
func (n *notifier) signal(channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.listeners[channel] {
		select {
		case ch <- struct{}{}:
		default: // one pending signal is enough
		}
	}
}

// subscribed notes Redis's confirmation of a SUBSCRIBE. One nobody waits
// for is go-redis subscribing again after a reconnect: what was published
// meanwhile is lost, so the channel's listeners are woken to read again.
func (n *notifier) subscribed(channel string) {
	n.mu.Lock()
	left, waited := n.pending[channel]
	switch {
	case waited && left > 1:
		n.pending[channel] = left - 1
	case waited:
		delete(n.pending, channel)
		if c := n.confirmed[channel]; c != nil {
			close(c)
			n.confirmed[channel] = closedChan
		}
	}
	n.mu.Unlock()
	if !waited {
		n.signal(channel)
	}
}

// closedChan stands for a confirmation that came.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// listen returns a channel that receives a signal for each message on
// channel (at most one pending), and stop to unregister it. It returns
// once the shared subscription is confirmed (or after subscribeWait), so
// a caller that reads the state after listen misses nothing.
func (n *notifier) listen(ctx context.Context, channel string) (<-chan struct{}, func()) {
	n.start.Do(n.open)
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

// watch is listen for a channel no pattern covers: the shared connection
// subscribes to it while it has listeners. It returns once Redis has
// confirmed the subscription (or after subscribeWait, or when ctx ends),
// so a caller that reads the state after watch misses nothing.
func (n *notifier) watch(ctx context.Context, channel string) (<-chan struct{}, func()) {
	n.start.Do(n.open)
	wait, cancel := context.WithTimeout(ctx, subscribeWait)
	defer cancel()
	// A SUBSCRIBE sent before the patterns are confirmed would have its
	// confirmation taken for theirs.
	select {
	case <-n.ready:
	case <-wait.Done():
	}
	ch := make(chan struct{}, 1)
	n.watching.Lock()
	n.mu.Lock()
	first := len(n.listeners[channel]) == 0
	if first {
		n.listeners[channel] = map[chan struct{}]struct{}{}
		n.pending[channel]++
		n.confirmed[channel] = make(chan struct{})
	}
	n.listeners[channel][ch] = struct{}{}
	confirmed := n.confirmed[channel]
	n.mu.Unlock()
	if first {
		n.command(n.ps.Subscribe, channel)
	}
	n.watching.Unlock()
	select {
	case <-confirmed:
	case <-wait.Done():
		if ctx.Err() == nil {
			n.giveUp(channel, confirmed)
		}
	}
	stop := func() {
		n.watching.Lock()
		defer n.watching.Unlock()
		n.mu.Lock()
		delete(n.listeners[channel], ch)
		last := len(n.listeners[channel]) == 0
		if last {
			delete(n.listeners, channel)
			delete(n.confirmed, channel)
		}
		n.mu.Unlock()
		if last {
			n.command(n.ps.Unsubscribe, channel)
		}
	}
	return ch, stop
}

// giveUp stops waiting for confirmations of channel's SUBSCRIBEs that
// did not come in time (lost with a dropped connection): counting them
// would hold up every later watcher of the channel. A confirmation that
// still comes is taken for a re-subscription, and wakes the listeners.
func (n *notifier) giveUp(channel string, confirmed chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.confirmed[channel] != confirmed || confirmed == closedChan {
		return
	}
	delete(n.pending, channel)
	close(confirmed)
	n.confirmed[channel] = closedChan
}

// command sends a SUBSCRIBE or UNSUBSCRIBE on the shared connection. A
// failure needs no answer here: go-redis reconnects and subscribes to
// what it should (confirming it to watch), and watchers read the state
// they wait for at least every few seconds anyway.
func (n *notifier) command(send func(context.Context, ...string) error, channel string) {
	ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
	defer cancel()
	_ = send(ctx, channel)
}
