// Package refs seals the handles connections return (gate 3 opens them):
// refs are bound to their thread, connection, lease and identity, signed
// with keys kept in Redis, and sensitive blobs are withheld from what
// models and people see. The engine seals every result it stores and opens
// every argument it sends.
//
// # Sealed refs
//
// A connection result may contain ref objects: handles on things the
// connection's server holds (an element, a window, a chat thread):
//
//	{"$ref": "<raw id>", "kind": "<kind>", "volatile": <bool>}
//
// An object is a ref object when "$ref" and "kind" are both strings;
// "volatile" (default false) says the ref points into something that is
// replaced with the connection's identity instance (a page's elements
// die with the browser). Other keys of the object are kept. Before a
// result is stored or shown, SealRefs replaces each ref object with
//
//	{"$ref": "<sealed token>", "kind": "<kind>"}
//
// where the token carries the raw id, kind, issuing connection and the
// volatile flag, and an HMAC-SHA256 binding them to the thread, the lease
// (for a leased connection) and, for a volatile ref, the identity's
// surface and instance. An epoch change alone (a hot reload) keeps volatile
// refs valid.
//
// Arguments pass the token back as {"$ref": "<sealed token>"} (a "kind" key
// and any other key may be copied along). At gate 3 OpenRefs opens every
// such object into its raw id: the server sees the raw id string, never the
// token or the object. An object whose "$ref" is a string that is not a
// token, with no keys but "$ref" and "kind", is a forged ref and refused; a
// "$ref" beside other keys (a JSON Schema reference, say) is left alone.
//
// A token is "pbr1." + base64url(JSON payload) + "." + base64url(MAC). The
// payload holds the key id, raw id, kind, connection, volatile flag and
// keyed digests of the thread, the lease and the identity, so a refusal can
// say which of them differed without the token revealing them. Signing
// keys are kept in the Redis hash store.Key("refkeys") (field "current"
// names the key in use), created with HSETNX so replicas racing at first
// start agree on one key, and kept across restarts and rotations: Rotate
// adds a new current key and older keys still verify.
//
// Blobs: an object {"$blob": …, "sensitive": true} stands for data a
// profile marks sensitive (a stored session); WithholdSensitive renders
// each as the string "[sensitive blob withheld]" wherever a value is shown
// to a model or a person.
package refs

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// Errors of opening a sealed ref, matched with errors.Is; Open and OpenRefs
// return them inside a *RefError.
var (
	ErrRefForged     = errors.New("ref was not issued by this harness (forged or malformed)")
	ErrRefThread     = errors.New("ref was issued to another thread")
	ErrRefRoute      = errors.New("ref was issued by another connection")
	ErrRefLease      = errors.New("ref was issued on another lease")
	ErrRefStale      = errors.New("ref points into a connection that has been replaced since")
	ErrRefKeyUnknown = errors.New("ref is signed with an unknown key")
)

// RefError is a refused ref: Err is one of the ErrRef… sentinels.
type RefError struct {
	Err error
	// Path is the JSON Pointer of the ref in the arguments (OpenRefs only).
	Path string
	// Connection issued the ref, when the token could be trusted that far.
	Connection string
}

func (e *RefError) Error() string {
	msg := e.Err.Error()
	if e.Connection != "" && errors.Is(e.Err, ErrRefRoute) {
		msg += " (" + e.Connection + ")"
	}
	if e.Path != "" {
		return "ref at " + e.Path + ": " + msg
	}
	return msg
}

func (e *RefError) Unwrap() error { return e.Err }

// RefContext is where a ref is issued or used.
type RefContext struct {
	// Thread is the issuing thread; children and parallel paths share
	// their parent's.
	Thread string
	// Connection issued the ref (Seal) or is being called (Open; "" skips
	// the routing check and leaves it to the caller).
	Connection string
	// Lease is the pool lease of the connection; "" when not leased.
	Lease string
	// Identity of the connection; only its surface and instance bind, and
	// only volatile refs.
	Identity connect.Identity
}

// Ref is an opened ref.
type Ref struct {
	Raw        string `json:"raw"`
	Kind       string `json:"kind"`
	Connection string `json:"connection"`
	Volatile   bool   `json:"volatile,omitempty"`
	KeyID      string `json:"keyId"`
}

// Limits of refs.
const (
	// MaxRawRefLen bounds a raw id, so a token stays a handle.
	MaxRawRefLen  = 4096
	maxTokenLen   = 3*MaxRawRefLen + 1024
	tokenPrefix   = "pbr1."
	refKeyBytes   = 32
	refDigestLen  = 16
	refKeysTTL    = 30 * time.Second
	SensitiveBlob = "[sensitive blob withheld]"
	withheldValue = "[value withheld: not inspectable]"
	refKeyCurrent = "current"
)

// Sealer seals and opens refs under signing keys kept in Redis. It is safe
// for concurrent use; every replica has its own Sealer over the same store.
type Sealer struct {
	store *store.Store
	now   func() time.Time

	mu       sync.Mutex
	keys     map[string][]byte
	current  string
	loadedAt time.Time
}

// NewSealer returns a Sealer over st. Keys are read (and the first one
// created) on first use.
func NewSealer(st *store.Store) *Sealer {
	return &Sealer{store: st, now: time.Now}
}

func (s *Sealer) hashKey() string { return s.store.Key("refkeys") }

// load reads the key hash, creating the first key when there is none.
func (s *Sealer) load(ctx context.Context) error {
	fields, err := s.store.Client.HGetAll(ctx, s.hashKey()).Result()
	if err != nil {
		return fmt.Errorf("refs: read signing keys: %w", err)
	}
	if fields[refKeyCurrent] == "" {
		// Racing replicas each offer a key; HSETNX keeps the first.
		key := make([]byte, refKeyBytes)
		_, _ = rand.Read(key)
		_, err := s.store.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSetNX(ctx, s.hashKey(), "k1", base64.StdEncoding.EncodeToString(key))
			p.HSetNX(ctx, s.hashKey(), refKeyCurrent, "k1")
			return nil
		})
		if err != nil {
			return fmt.Errorf("refs: create the first signing key: %w", err)
		}
		if fields, err = s.store.Client.HGetAll(ctx, s.hashKey()).Result(); err != nil {
			return fmt.Errorf("refs: read signing keys: %w", err)
		}
	}
	keys := make(map[string][]byte, len(fields))
	for id, v := range fields {
		if id == refKeyCurrent {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil || len(b) != refKeyBytes {
			return fmt.Errorf("refs: signing key %q in Redis is damaged", id)
		}
		keys[id] = b
	}
	cur := fields[refKeyCurrent]
	if keys[cur] == nil {
		return fmt.Errorf("refs: the current signing key %q is missing from Redis", cur)
	}
	s.mu.Lock()
	s.keys, s.current, s.loadedAt = keys, cur, s.now()
	s.mu.Unlock()
	return nil
}

// signingKey returns the current key, rereading Redis every refKeysTTL so
// a rotation on another replica is picked up.
func (s *Sealer) signingKey(ctx context.Context) (string, []byte, error) {
	s.mu.Lock()
	fresh := s.keys != nil && s.now().Sub(s.loadedAt) < refKeysTTL
	id, key := s.current, s.keys[s.current]
	s.mu.Unlock()
	if fresh {
		return id, key, nil
	}
	if err := s.load(ctx); err != nil {
		if key != nil {
			return id, key, nil // keep sealing with the known key through a blip
		}
		return "", nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, s.keys[s.current], nil
}

// verifyKey returns the key with id, rereading Redis when it is not
// known: another replica may have rotated a moment ago. A made-up id costs
// one small HGETALL, no more than any other request does.
func (s *Sealer) verifyKey(ctx context.Context, id string) ([]byte, error) {
	s.mu.Lock()
	key := s.keys[id]
	s.mu.Unlock()
	if key != nil {
		return key, nil
	}
	if err := s.load(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if key = s.keys[id]; key == nil {
		return nil, ErrRefKeyUnknown
	}
	return key, nil
}

// rotateScript makes a new current key unless the current key is no longer
// the one the caller saw (another replica rotated first, or this script
// already ran and is being retried); either way it returns the current id.
var rotateScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'current')
if cur ~= ARGV[1] then return cur end
redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'current', ARGV[2])
return ARGV[2]`)

// Rotate makes a new signing key current and returns its id. Refs sealed
// under older keys still open. Replicas rotating at once make one new key.
func (s *Sealer) Rotate(ctx context.Context) (string, error) {
	if err := s.load(ctx); err != nil {
		return "", err
	}
	s.mu.Lock()
	cur := s.current
	s.mu.Unlock()
	n, err := strconv.Atoi(strings.TrimPrefix(cur, "k"))
	if err != nil {
		return "", fmt.Errorf("refs: the current signing key id %q is not k<number>", cur)
	}
	key := make([]byte, refKeyBytes)
	_, _ = rand.Read(key)
	next := "k" + strconv.Itoa(n+1)
	id, err := rotateScript.Run(ctx, s.store.Client, []string{s.hashKey()}, cur, next, base64.StdEncoding.EncodeToString(key)).Text()
	if err != nil {
		return "", fmt.Errorf("refs: rotate signing key: %w", err)
	}
	if err := s.load(ctx); err != nil {
		return "", err
	}
	return id, nil
}

// refPayload is what a token carries. Field names are short: tokens travel
// through model context.
type refPayload struct {
	Key        string `json:"k"`
	Raw        string `json:"r"`
	Kind       string `json:"n"`
	Connection string `json:"c"`
	Volatile   bool   `json:"v,omitempty"`
	Thread     string `json:"t"`
	Lease      string `json:"l"`
	Identity   string `json:"i,omitempty"`
}

// refDigest is a keyed digest of parts under label, length-prefixed so
// that no two different tuples collide.
func refDigest(key []byte, label string, parts ...string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("patchbay ref v1\x00" + label + "\x00"))
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		m.Write(n[:])
		m.Write([]byte(p))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:refDigestLen])
}

func refMAC(key, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("patchbay ref v1\x00mac\x00"))
	m.Write(payload)
	return m.Sum(nil)
}

// Seal returns the token for the raw ref of kind issued by rc.Connection.
func (s *Sealer) Seal(ctx context.Context, raw, kind string, volatile bool, rc RefContext) (string, error) {
	switch {
	case raw == "":
		return "", errors.New("refs: seal: empty ref")
	case len(raw) > MaxRawRefLen:
		return "", fmt.Errorf("refs: seal: ref longer than %d bytes", MaxRawRefLen)
	case rc.Connection == "":
		return "", errors.New("refs: seal: no issuing connection")
	}
	id, key, err := s.signingKey(ctx)
	if err != nil {
		return "", err
	}
	p := refPayload{
		Key: id, Raw: raw, Kind: kind, Connection: rc.Connection, Volatile: volatile,
		Thread: refDigest(key, "thread", rc.Thread),
		Lease:  refDigest(key, "lease", rc.Lease),
	}
	if volatile {
		p.Identity = refDigest(key, "identity", rc.Identity.Surface, rc.Identity.Instance)
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("refs: seal: %w", err)
	}
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(payload) + "." +
		base64.RawURLEncoding.EncodeToString(refMAC(key, payload)), nil
}

// IsSealedRef reports whether s has the shape of a token (not whether it
// opens).
func IsSealedRef(s string) bool { return strings.HasPrefix(s, tokenPrefix) }

// Open checks token against rc and returns the ref it stands for. A
// refusal is a *RefError wrapping, in the order checked: ErrRefForged
// (malformed or bad MAC), ErrRefKeyUnknown, ErrRefThread, ErrRefRoute (when
// rc.Connection is set and is not the issuer), ErrRefLease, ErrRefStale
// (volatile ref, identity surface or instance changed). Any other error is
// Redis failing.
func (s *Sealer) Open(ctx context.Context, token string, rc RefContext) (Ref, error) {
	forged := &RefError{Err: ErrRefForged}
	body, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(token) > maxTokenLen {
		return Ref{}, forged
	}
	enc, sig, ok := strings.Cut(body, ".")
	if !ok {
		return Ref{}, forged
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(enc)
	mac, err2 := base64.RawURLEncoding.DecodeString(sig)
	var p refPayload
	if err1 != nil || err2 != nil || json.Unmarshal(payload, &p) != nil || p.Key == "" {
		return Ref{}, forged
	}
	key, err := s.verifyKey(ctx, p.Key)
	if errors.Is(err, ErrRefKeyUnknown) {
		return Ref{}, &RefError{Err: ErrRefKeyUnknown}
	}
	if err != nil {
		return Ref{}, err
	}
	if !hmac.Equal(mac, refMAC(key, payload)) || p.Raw == "" || p.Connection == "" {
		return Ref{}, forged
	}
	ref := Ref{Raw: p.Raw, Kind: p.Kind, Connection: p.Connection, Volatile: p.Volatile, KeyID: p.Key}
	refuse := func(e error) (Ref, error) { return ref, &RefError{Err: e, Connection: p.Connection} }
	switch {
	case !hmac.Equal([]byte(p.Thread), []byte(refDigest(key, "thread", rc.Thread))):
		return refuse(ErrRefThread)
	case rc.Connection != "" && rc.Connection != p.Connection:
		return refuse(ErrRefRoute)
	case !hmac.Equal([]byte(p.Lease), []byte(refDigest(key, "lease", rc.Lease))):
		return refuse(ErrRefLease)
	case p.Volatile && !hmac.Equal([]byte(p.Identity), []byte(refDigest(key, "identity", rc.Identity.Surface, rc.Identity.Instance))):
		return refuse(ErrRefStale)
	}
	return ref, nil
}

// SealRefs returns a deep copy of the result v with every ref object
// sealed for rc (see the package doc). Values of other types are first
// turned into plain JSON values.
func (s *Sealer) SealRefs(ctx context.Context, v any, rc RefContext) (any, error) {
	return rewriteJSON(v, "", func(m map[string]any, path string) (any, bool, error) {
		raw, ok1 := m["$ref"].(string)
		kind, ok2 := m["kind"].(string)
		if !ok1 || !ok2 {
			return nil, false, nil
		}
		volatile := false
		if vol, present := m["volatile"]; present {
			b, ok := vol.(bool)
			if !ok {
				return nil, false, fmt.Errorf("refs: ref at %s: volatile must be a boolean", RefPathOrRoot(path))
			}
			volatile = b
		}
		token, err := s.Seal(ctx, raw, kind, volatile, rc)
		if err != nil {
			return nil, false, fmt.Errorf("%w (at %s)", err, RefPathOrRoot(path))
		}
		out := make(map[string]any, len(m))
		for k, item := range m {
			switch k {
			case "$ref", "volatile":
			default:
				sealed, err := s.SealRefs(ctx, item, rc)
				if err != nil {
					return nil, false, err
				}
				out[k] = sealed
			}
		}
		out["$ref"] = token
		return out, true, nil
	})
}

// OpenRefs returns a deep copy of the call arguments v with every
// {"$ref": token} object replaced by its raw id string, and the refs in
// the order met (object keys sorted). The first refused ref stops it with
// a *RefError naming its path. Gate 3 checks the routing: with
// rc.Connection set, a ref issued by another connection is ErrRefRoute;
// the returned Refs also name their issuer.
func (s *Sealer) OpenRefs(ctx context.Context, v any, rc RefContext) (any, []Ref, error) {
	var refs []Ref
	out, err := rewriteJSON(v, "", func(m map[string]any, path string) (any, bool, error) {
		token, ok := m["$ref"].(string)
		if !ok {
			return nil, false, nil
		}
		if !IsSealedRef(token) {
			if RefOnlyKeys(m, "$ref", "kind") {
				return nil, false, &RefError{Err: ErrRefForged, Path: RefPathOrRoot(path)}
			}
			return nil, false, nil
		}
		ref, err := s.Open(ctx, token, rc)
		if err != nil {
			var re *RefError
			if errors.As(err, &re) {
				re.Path = RefPathOrRoot(path)
			}
			return nil, false, err
		}
		refs = append(refs, ref)
		return ref.Raw, true, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, refs, nil
}

var refPointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

func RefOnlyKeys(m map[string]any, keys ...string) bool {
	for k := range m {
		if !slices.Contains(keys, k) {
			return false
		}
	}
	return true
}

func RefPathOrRoot(path string) string {
	if path == "" {
		return "/"
	}
	return path
}

// WithholdSensitive returns a deep copy of v with every sensitive blob
// ({"$blob": …, "sensitive": true}) replaced by the string
// "[sensitive blob withheld]".
func WithholdSensitive(v any) any {
	out, err := rewriteJSON(v, "", func(m map[string]any, _ string) (any, bool, error) {
		_, blob := m["$blob"]
		if sensitive, _ := m["sensitive"].(bool); blob && sensitive {
			return SensitiveBlob, true, nil
		}
		return nil, false, nil
	})
	if err != nil {
		// Too deep or not JSON: it cannot be inspected, so it is not shown.
		return withheldValue
	}
	return out
}

// rewriteJSON deep-copies the JSON-like value v, offering every object to
// visit (with its JSON Pointer) before descending into it; when visit
// handles the object its replacement is used as is. Non-JSON types are
// turned into plain JSON values first.
func rewriteJSON(v any, path string, visit func(m map[string]any, path string) (any, bool, error)) (any, error) {
	return rewriteJSONDepth(v, path, visit, 0)
}

func rewriteJSONDepth(v any, path string, visit func(map[string]any, string) (any, bool, error), depth int) (any, error) {
	if depth > secrets.MaxRedactDepth {
		return nil, fmt.Errorf("refs: value nested deeper than %d at %s", secrets.MaxRedactDepth, RefPathOrRoot(path))
	}
	switch x := v.(type) {
	case nil, bool, string, float64, float32, int, int8, int16, int32, int64,
		uint, uint8, uint16, uint32, uint64, json.Number:
		return x, nil
	case map[string]any:
		if out, ok, err := visit(x, path); err != nil || ok {
			return out, err
		}
		out := make(map[string]any, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			item, err := rewriteJSONDepth(x[k], path+"/"+refPointerEscape.Replace(k), visit, depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = item
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			y, err := rewriteJSONDepth(item, path+"/"+strconv.Itoa(i), visit, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = y
		}
		return out, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("refs: value at %s is not JSON: %w", RefPathOrRoot(path), err)
	}
	var plain any
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&plain); err != nil {
		return nil, fmt.Errorf("refs: value at %s is not JSON: %w", RefPathOrRoot(path), err)
	}
	return rewriteJSONDepth(plain, path, visit, depth+1)
}

// RefID is $refId(x) in expressions: the raw id of a ref object (sealed or
// not), or of a token string, so documents can compare refs. Reading an id
// grants nothing: a ref is verified when a call passes it, at gate 3.
func RefID(params ...any) (any, error) {
	if len(params) != 1 {
		return nil, fmt.Errorf("$refId takes one ref")
	}
	v := params[0]
	if m, ok := v.(map[string]any); ok {
		v = m["$ref"]
	}
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("$refId: %T is not a ref", params[0])
	}
	body, sealed := strings.CutPrefix(s, tokenPrefix)
	if !sealed {
		return s, nil
	}
	enc, _, _ := strings.Cut(body, ".")
	payload, err := base64.RawURLEncoding.DecodeString(enc)
	var p refPayload
	if err != nil || json.Unmarshal(payload, &p) != nil || p.Raw == "" {
		return nil, fmt.Errorf("$refId: not a ref")
	}
	return p.Raw, nil
}
