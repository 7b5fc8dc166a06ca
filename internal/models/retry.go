package models

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// capRetryAfter returns a middleware (same shape in both SDKs) that lowers a
// Retry-After / Retry-After-Ms header longer than max to max, so the SDK's own
// retry honours the server's wish up to a bound.
func capRetryAfter(max time.Duration) func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	return func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		res, err := next(req)
		if err != nil || res == nil {
			return res, err
		}
		if v := res.Header.Get("Retry-After-Ms"); v != "" {
			if ms, perr := strconv.ParseFloat(v, 64); perr == nil && time.Duration(ms*float64(time.Millisecond)) > max {
				res.Header.Set("Retry-After-Ms", strconv.FormatInt(max.Milliseconds(), 10))
			}
		}
		if v := res.Header.Get("Retry-After"); v != "" {
			var d time.Duration
			if s, perr := strconv.ParseFloat(v, 64); perr == nil {
				d = time.Duration(s * float64(time.Second))
			} else if t, perr := http.ParseTime(v); perr == nil {
				d = time.Until(t)
			}
			if d > max {
				res.Header.Set("Retry-After", strconv.FormatFloat(max.Seconds(), 'f', -1, 64))
			}
		}
		return res, nil
	}
}

func urlEscape(s string) string { return url.QueryEscape(s) }

// normaliseOpenAIError rewrites an error body of the form {"error": "text"}
// (llama.cpp, some Ollama versions, proxies) into the OpenAI shape
// {"error": {"message": "text"}}, which is the only one the SDK can decode;
// otherwise the status code would be lost behind a JSON decoding error.
func normaliseOpenAIError(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	res, err := next(req)
	if err != nil || res == nil || res.StatusCode < 400 || res.Body == nil {
		return res, err
	}
	raw, rerr := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	res.Body.Close()
	if rerr != nil {
		raw = nil
	}
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	var text string
	if json.Unmarshal(raw, &body) == nil && json.Unmarshal(body.Error, &text) == nil {
		raw, _ = json.Marshal(map[string]any{"error": map[string]any{"message": text}})
	} else if !json.Valid(raw) {
		raw, _ = json.Marshal(map[string]any{"error": map[string]any{"message": strings.TrimSpace(string(raw))}})
	}
	res.Body = io.NopCloser(bytes.NewReader(raw))
	res.ContentLength = int64(len(raw))
	res.Header.Del("Content-Length")
	res.Header.Set("Content-Type", "application/json")
	return res, nil
}
