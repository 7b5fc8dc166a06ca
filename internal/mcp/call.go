package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// A tool call over stdio is sent by patchbay rather than by mcp-go's
// Client.CallTool. mcp-go builds each request for any transport: it
// encodes the params and decodes them again to merge the 2026-07-28 _meta,
// does the same once more to compute the Mcp-Method, Mcp-Name and
// Mcp-Param-* headers (which only Streamable HTTP sends), and decodes each
// result twice. On a busy stdio connection that was a fifth of the
// server's CPU. directCall writes the request's params once, with the
// session-constant part of _meta encoded when the session was opened, and
// decodes the result once; what goes on the wire is what mcp-go would
// send (call_test.go compares the two).
//
// Everything else stays as it was: the request goes through the
// session's transport, which is its capture (answers of a parked call,
// task handles, input_required noted for parking), the questions of an
// input_required result go to the client's elicitation handler, bounded as
// mcp-go bounds them, and the errors are those mcp-go's client gives, so
// callOnce maps them alike. HTTP sessions (Streamable HTTP, legacy SSE)
// keep mcp-go's path: Streamable HTTP needs the headers it computes,
// capture re-issues requests on it, and an HTTP request is cancelled by
// ending it, not by a notification.

// maxShedRounds bounds the input_required results in a row that ask for
// nothing (a server shedding load: "try again"), as mcp-go bounds them.
const maxShedRounds = 3

// cancelNoticeTimeout bounds sending the notifications/cancelled of a call
// whose caller gave up (mcp-go allows the same).
const cancelNoticeTimeout = 5 * time.Second

// callIDPrefix starts the JSON-RPC id of every call directCall sends. The
// stdio transport keys pending requests by id and kind (mcp.RequestId's
// String: "string:…" or "int64:…"); mcp-go numbers its own requests, and
// patchbay's other string ids start pb-<random upper-case base32> or
// pb-events-, pb-update-, pb-discover-, so none can take a call's answer.
const callIDPrefix = "pb-call-"

// directCall sends the tools/call requests of one stdio session.
type directCall struct {
	client *client.Client      // the session's client (initialized, era)
	trans  transport.Interface // the client's transport: the capture
	elicit client.ElicitationHandler
	// meta is the part of _meta mcp-go adds to every request on a
	// 2026-07-28 connection, as `"key":value` members sorted by key,
	// encoded once; nil on a 2025 connection, where mcp-go adds nothing.
	meta []metaMember
	ids  atomic.Int64
}

// metaMember is one encoded member of _meta.
type metaMember struct {
	key     string
	encoded []byte // "key":value
}

// metaField is one of patchbay's own _meta entries of a call.
type metaField struct{ key, value string }

// newDirectCall prepares the tools/call path of a session whose client
// has connected. handler is the elicitation handler the client was given,
// info the client info it was initialized with.
func newDirectCall(cl *client.Client, handler client.ElicitationHandler, info mcp.Implementation) (*directCall, error) {
	d := &directCall{client: cl, trans: cl.GetTransport(), elicit: handler}
	version := cl.ProtocolVersion()
	if !mcp.IsModernProtocol(version) {
		return d, nil
	}
	// What mcp-go computes for every request (applyRequestMeta), fixed for
	// the session: the negotiated version, the capabilities it declares for
	// the options patchbay gives (its configured set plus what a handler
	// implies; patchbay gives an elicitation handler, and neither sampling
	// nor roots), and the client info given to Initialize. mcp-go adds a
	// log level too once SetLevel was called, which patchbay never does.
	caps := cl.GetClientCapabilities()
	if handler != nil && caps.Elicitation == nil {
		caps.Elicitation = &mcp.ElicitationCapability{}
	}
	members := []struct {
		key   string
		value any
	}{
		{mcp.MetaKeyProtocolVersion, version},
		{mcp.MetaKeyClientCapabilities, caps},
	}
	if info.Name != "" {
		members = append(members, struct {
			key   string
			value any
		}{mcp.MetaKeyClientInfo, info})
	}
	for _, m := range members {
		value, err := json.Marshal(m.value)
		if err != nil {
			return nil, fmt.Errorf("encode _meta %s: %w", m.key, err)
		}
		d.meta = append(d.meta, metaMember{key: m.key, encoded: append(appendMember(nil, m.key), value...)})
	}
	slices.SortFunc(d.meta, func(a, b metaMember) int { return strings.Compare(a.key, b.key) })
	return d, nil
}

// call sends tools/call name with args (a JSON object; nil is sent as {})
// and patchbay's _meta fields, and answers the questions of input_required
// results through the elicitation handler, at most maxInputRounds sends in
// all.
func (d *directCall) call(ctx context.Context, name string, args map[string]any, fields []metaField) (*mcp.CallToolResult, error) {
	var argsJSON []byte
	if args == nil {
		argsJSON = []byte("{}")
	} else {
		var err error
		if argsJSON, err = json.Marshal(args); err != nil {
			return nil, transport.NewError(fmt.Errorf("failed to marshal request: %w", err))
		}
	}
	slices.SortStableFunc(fields, func(a, b metaField) int { return strings.Compare(a.key, b.key) })
	var (
		answers mcp.MultiRoundTripParams
		shed    int
	)
	for sent := 1; ; sent++ {
		res, err := d.send(ctx, d.params(name, argsJSON, fields, answers))
		if err != nil {
			return nil, err
		}
		if res.ResultType != mcp.ResultTypeInputRequired {
			return res, nil
		}
		// An input_required result without requests asks to be sent again
		// later; only so many in a row are tolerated.
		if len(res.InputRequests) > 0 {
			shed = 0
		} else if shed++; shed >= maxShedRounds {
			return nil, fmt.Errorf("%w: server asked to retry %d times without requesting input", client.ErrMaxInputRoundTripsExceeded, shed)
		}
		if sent >= maxInputRounds {
			return nil, fmt.Errorf("%w (%d)", client.ErrMaxInputRoundTripsExceeded, maxInputRounds)
		}
		responses, err := d.answer(ctx, res.InputRequests)
		if err != nil {
			return nil, fmt.Errorf("multi round-trip: %w", err)
		}
		answers = mcp.MultiRoundTripParams{InputResponses: responses, RequestState: res.RequestState}
	}
}

// send sends one tools/call with params and decodes its result. The
// errors are mcp-go's: a transport's failure wrapped in *transport.Error,
// a JSON-RPC error as its AsError, a result that is no tool result as
// ParseCallToolResult reports it.
func (d *directCall) send(ctx context.Context, params []byte) (*mcp.CallToolResult, error) {
	if !d.client.IsInitialized() {
		return nil, errors.New("client not initialized")
	}
	if err := ctx.Err(); err != nil {
		return nil, transport.NewError(err) // not sent: nothing to cancel
	}
	req := transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION,
		ID:      mcp.NewRequestId(callIDPrefix + strconv.FormatInt(d.ids.Add(1), 10)),
		Method:  string(mcp.MethodToolsCall),
		Params:  json.RawMessage(params),
	}
	resp, err := d.trans.SendRequest(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			d.cancelled(ctx, req.ID)
		}
		return nil, transport.NewError(err)
	}
	if resp.Error != nil {
		return nil, resp.Error.AsError()
	}
	return decodeCallResult(resp.Result)
}

// cancelled tells the server that the caller gave up on request id, with
// the notifications/cancelled that is the only way to cancel a request
// over stdio. It is sent in the background on a context of its own (the
// call's has ended) and may fail: the call's error is decided already.
func (d *directCall) cancelled(ctx context.Context, id mcp.RequestId) {
	note := mcp.JSONRPCNotification{
		JSONRPC: mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{
			Method: string(mcp.MethodNotificationCancelled),
			Params: mcp.NotificationParams{AdditionalFields: map[string]any{"requestId": id, "reason": ctx.Err().Error()}},
		},
	}
	go func() {
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelNoticeTimeout)
		defer cancel()
		_ = d.trans.SendNotification(nctx, note)
	}()
}

// params writes the params of one tools/call as mcp-go's client writes
// them for the session's era. On 2026-07-28 mcp-go re-encodes the params
// as a JSON object, so their members and _meta's come sorted by key (its
// own members win over a call's of the same name); on 2025 they keep
// CallToolParams' field order, with _meta only when the call has fields.
func (d *directCall) params(name string, args []byte, fields []metaField, answers mcp.MultiRoundTripParams) []byte {
	var responses []byte
	if len(answers.InputResponses) > 0 {
		var err error
		if responses, err = json.Marshal(answers.InputResponses); err != nil {
			responses = []byte("null") // InputResponse encodes what it holds; not reached
		}
	}
	b := make([]byte, 0, 64+len(args)+len(name)+d.metaLen(fields)+len(responses)+len(answers.RequestState))
	b = append(b, '{')
	if d.meta != nil {
		b = append(b, `"_meta":`...)
		b = d.appendMeta(b, fields)
		b = append(b, `,"arguments":`...)
		b = append(b, args...)
		if responses != nil {
			b = append(b, `,"inputResponses":`...)
			b = append(b, responses...)
		}
		b = append(b, `,"name":`...)
		b = appendString(b, name)
		if answers.RequestState != "" {
			b = append(b, `,"requestState":`...)
			b = appendString(b, answers.RequestState)
		}
		return append(b, '}')
	}
	b = append(b, `"name":`...)
	b = appendString(b, name)
	b = append(b, `,"arguments":`...)
	b = append(b, args...)
	if len(fields) > 0 {
		b = append(b, `,"_meta":`...)
		b = d.appendMeta(b, fields)
	}
	if responses != nil {
		b = append(b, `,"inputResponses":`...)
		b = append(b, responses...)
	}
	if answers.RequestState != "" {
		b = append(b, `,"requestState":`...)
		b = appendString(b, answers.RequestState)
	}
	return append(b, '}')
}

// appendMeta writes _meta: the session's members merged with the call's
// fields (both sorted by key; a session member wins a key both have).
func (d *directCall) appendMeta(b []byte, fields []metaField) []byte {
	b = append(b, '{')
	first := true
	sep := func() {
		if !first {
			b = append(b, ',')
		}
		first = false
	}
	i, j := 0, 0
	for i < len(d.meta) || j < len(fields) {
		switch {
		case j == len(fields) || i < len(d.meta) && d.meta[i].key < fields[j].key:
			sep()
			b = append(b, d.meta[i].encoded...)
			i++
		case i < len(d.meta) && d.meta[i].key == fields[j].key:
			j++ // the session's member is written next
		default:
			if j+1 < len(fields) && fields[j+1].key == fields[j].key {
				j++ // the later of two fields of one key, as in a map
				continue
			}
			sep()
			b = appendMember(b, fields[j].key)
			b = appendString(b, fields[j].value)
			j++
		}
	}
	return append(b, '}')
}

func (d *directCall) metaLen(fields []metaField) int {
	n := 2
	for _, m := range d.meta {
		n += len(m.encoded) + 1
	}
	for _, f := range fields {
		n += len(f.key) + len(f.value) + 6
	}
	return n
}

// appendMember writes `"key":`.
func appendMember(b []byte, key string) []byte {
	return append(appendString(b, key), ':')
}

// appendString writes s as encoding/json does: a string of printable ASCII
// without quotes, backslashes or the HTML characters it escapes is
// written as it is, anything else through json.Marshal.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			enc, _ := json.Marshal(s) // a string always encodes
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// answer answers the input requests of an input_required result, all at
// once (they are independent); the first failure cancels the others and
// fails the round.
func (d *directCall) answer(ctx context.Context, requests mcp.InputRequests) (mcp.InputResponses, error) {
	if len(requests) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		id  string
		res mcp.InputResponse
		err error
	}
	done := make(chan outcome, len(requests))
	for id, req := range requests {
		go func() {
			res, err := d.answerOne(ctx, req)
			done <- outcome{id: id, res: res, err: err}
		}()
	}
	responses := make(mcp.InputResponses, len(requests))
	var failed error
	for range requests {
		o := <-done
		switch {
		case o.err != nil && failed == nil:
			failed = fmt.Errorf("fulfilling input request %q: %w", o.id, o.err)
			cancel()
		case o.err == nil:
			responses[o.id] = o.res
		}
	}
	if failed != nil {
		return nil, failed
	}
	return responses, nil
}

// answerOne answers one input request. Only elicitation has a handler;
// patchbay declares neither sampling nor roots.
func (d *directCall) answerOne(ctx context.Context, req mcp.InputRequest) (mcp.InputResponse, error) {
	switch req.Method {
	case mcp.MethodElicitationCreate:
		switch {
		case d.elicit == nil:
			return mcp.InputResponse{}, errors.New("no elicitation handler configured")
		case req.Elicitation == nil:
			return mcp.InputResponse{}, errors.New("elicitation input request has no params")
		}
		res, err := d.elicit.Elicit(ctx, mcp.ElicitationRequest{
			Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
			Params:  *req.Elicitation,
		})
		if err != nil {
			return mcp.InputResponse{}, err
		}
		if res == nil {
			return mcp.InputResponse{}, errors.New("elicitation handler returned no result")
		}
		return mcp.NewElicitationInputResponse(*res), nil
	case mcp.MethodSamplingCreateMessage:
		return mcp.InputResponse{}, errors.New("no sampling handler configured")
	case mcp.MethodListRoots:
		return mcp.InputResponse{}, errors.New("no roots handler configured")
	}
	return mcp.InputResponse{}, fmt.Errorf("unsupported input request method %q", req.Method)
}

// wireResult is a tools/call result as it arrives.
type wireResult struct {
	Meta              *mcp.Meta         `json:"_meta,omitempty"`
	ResultType        mcp.ResultType    `json:"resultType,omitempty"`
	Content           []wireContent     `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent,omitempty"`
	IsError           bool              `json:"isError,omitempty"`
	InputRequests     mcp.InputRequests `json:"inputRequests,omitempty"`
	RequestState      string            `json:"requestState,omitempty"`
}

// wireContent is one content block, decoded where it stands.
type wireContent struct{ mcp.Content }

func (w *wireContent) UnmarshalJSON(data []byte) error {
	// Most blocks are text; one decode tells, and the rest go the way
	// mcp-go takes every block.
	var text mcp.TextContent
	if json.Unmarshal(data, &text) == nil && text.Type == mcp.ContentTypeText {
		w.Content = text
		return nil
	}
	c, err := mcp.UnmarshalContent(data)
	w.Content = c
	return err
}

// decodeCallResult decodes a tools/call result in one pass, to what
// mcp.ParseCallToolResult gives, with one difference: StructuredContent
// is left nil beside RawStructuredContent, which is what resultValue
// reads (it was decoded twice before).
func decodeCallResult(raw json.RawMessage) (*mcp.CallToolResult, error) {
	var w wireResult
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("failed to unmarshal response: %w", err)
	}
	if w.Content == nil && w.ResultType != mcp.ResultTypeInputRequired {
		// Absent or null: only a result without the member is refused.
		var probe struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(raw, &probe) != nil || probe.Content == nil {
			return nil, errors.New("content is missing")
		}
	}
	res := &mcp.CallToolResult{
		Result:               mcp.Result{Meta: w.Meta, ResultType: w.ResultType},
		MultiRoundTripResult: mcp.MultiRoundTripResult{InputRequests: w.InputRequests, RequestState: w.RequestState},
		IsError:              w.IsError,
		RawStructuredContent: w.StructuredContent,
	}
	if len(w.Content) > 0 {
		res.Content = make([]mcp.Content, len(w.Content))
		for i, c := range w.Content {
			res.Content[i] = c.Content
		}
	}
	return res, nil
}
