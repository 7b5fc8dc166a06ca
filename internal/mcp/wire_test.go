package mcp

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestEventLimit: the bound is per event (up to a blank line, with LF,
// CRLF or CR line ends), not per stream, and a breach is reported once.
func TestEventLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stream string
		fail   bool
	}{
		{"many small events (LF)", strings.Repeat("data: 0123456789\n\n", 1000), false},
		{"many small events (CRLF)", strings.Repeat("data: 0123456789\r\n\r\n", 1000), false},
		{"many small events (CR)", strings.Repeat("data: 0123456789\r\r", 1000), false},
		{"an event of exactly the limit", "data: 0123456789abcdefghijklm\n\n", false},
		{"one long line", "data: " + strings.Repeat("x", 64) + "\n\n", true},
		{"many lines of one event", strings.Repeat("data: 0123456\n", 8) + "\n", true},
		{"CRLF lines of one event", strings.Repeat("data: 0123456\r\n", 8) + "\r\n", true},
		{"no line end at all", strings.Repeat("x", 1<<20), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var faults int
			body := &eventLimit{rc: io.NopCloser(strings.NewReader(tt.stream)), limit: 29, fault: func(error) { faults++ }}
			n, err := io.Copy(io.Discard, body)
			if tt.fail != (err != nil) || faults != map[bool]int{true: 1, false: 0}[tt.fail] {
				t.Fatalf("read %d bytes, err = %v, %d faults; want failure %v", n, err, faults, tt.fail)
			}
			if tt.fail && (!errors.Is(err, ErrResponseTooLarge) || n >= int64(len(tt.stream))) {
				t.Errorf("err = %v after %d of %d bytes; want ErrResponseTooLarge before the end", err, n, len(tt.stream))
			}
		})
	}
}
