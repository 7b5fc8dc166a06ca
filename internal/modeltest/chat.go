package modeltest

import (
	"fmt"
	"net/http"
)

// ChatCall is one tool call of a scripted chat-completions conversation:
// the tool's name and its arguments as JSON text.
type ChatCall struct{ Tool, Args string }

// WriteChatTurn answers one request of a scripted conversation as an
// OpenAI-compatible chat-completions server streams it: turn n (the tool
// results the request carries) below len(calls) calls calls[n] (id
// call_<n+1>), and the turn after the last says text. model names the
// model in the chunks.
func WriteChatTurn(w http.ResponseWriter, model string, turn int, calls []ChatCall, text string) {
	chunk := func(delta, finish string) string {
		return fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`,
			model, delta, finish)
	}
	var frames []string
	if turn < len(calls) {
		c := calls[turn]
		frames = []string{
			chunk(fmt.Sprintf(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_%02d","type":"function","function":{"name":%q,"arguments":%q}}]}`, turn+1, c.Tool, c.Args), "null"),
			chunk(`{}`, `"tool_calls"`),
		}
	} else {
		frames = []string{chunk(fmt.Sprintf(`{"role":"assistant","content":%q}`, text), "null"), chunk(`{}`, `"stop"`)}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, f := range append(frames, "data: [DONE]") {
		fmt.Fprint(w, f, "\n\n")
	}
}
