package triggers

import (
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

func TestChooseDelivery(t *testing.T) {
	t.Parallel()
	const public = "https://patchbay.example.com"
	cases := []struct {
		name     string
		delivery []string
		public   string
		want     string
		err      string
	}{
		{"webhook preferred over poll", []string{"poll", "webhook"}, public, harness.DeliveryWebhook, ""},
		{"poll without a public URL", []string{"poll", "webhook"}, "", harness.DeliveryPoll, ""},
		{"webhook only", []string{"webhook"}, public, harness.DeliveryWebhook, ""},
		{"webhook only without a public URL", []string{"webhook"}, "", "", "PATCHBAY_PUBLIC_URL"},
		{"poll only", []string{"poll"}, public, harness.DeliveryPoll, ""},
		{"nothing patchbay takes", []string{"push"}, public, "", "only by [push]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := chooseDelivery(harness.EventType{Name: "e", Delivery: c.delivery}, c.public)
			if got != c.want || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
				t.Errorf("chooseDelivery(%v, %q) = %q, %v; want %q, error with %q", c.delivery, c.public, got, err, c.want, c.err)
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
