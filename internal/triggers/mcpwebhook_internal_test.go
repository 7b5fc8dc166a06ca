package triggers

import (
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// The order the reference asks for: push, webhook, poll; each only when
// patchbay can take it.
func TestChooseDeliveryOrder(t *testing.T) {
	t.Parallel()
	const public = "https://patchbay.example.com"
	cases := []struct {
		name     string
		delivery []string
		stream   bool
		public   string
		want     string
		err      string
	}{
		{"push preferred over webhook and poll", []string{"poll", "webhook", "push"}, true, public, connect.DeliveryPush, ""},
		{"webhook when the transport cannot stream", []string{"poll", "webhook", "push"}, false, public, connect.DeliveryWebhook, ""},
		{"webhook preferred over poll", []string{"poll", "webhook"}, true, public, connect.DeliveryWebhook, ""},
		{"poll without a public URL", []string{"poll", "webhook"}, true, "", connect.DeliveryPoll, ""},
		{"webhook only", []string{"webhook"}, true, public, connect.DeliveryWebhook, ""},
		{"webhook only without a public URL", []string{"webhook"}, true, "", "", "PATCHBAY_PUBLIC_URL"},
		{"poll only", []string{"poll"}, true, public, connect.DeliveryPoll, ""},
		{"push only on a transport that cannot stream", []string{"push"}, false, public, "", "only by [push]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := chooseDelivery(connect.EventType{Name: "e", Delivery: c.delivery}, c.stream, c.public)
			if got != c.want || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
				t.Errorf("chooseDelivery(%v, %v, %q) = %q, %v; want %q, error with %q", c.delivery, c.stream, c.public, got, err, c.want, c.err)
			}
		})
	}
}

func TestWebhookSecretShape(t *testing.T) {
	t.Parallel()
	a, b := newWebhookSecret(), newWebhookSecret()
	if !strings.HasPrefix(a, "whsec_") || len(a) != len("whsec_")+44 || a == b {
		t.Errorf("secrets %q, %q: want distinct whsec_ + base64 of 32 bytes", a, b)
	}
}
