package openapi

import (
	"context"
	"fmt"
	"regexp"
)

// SecretResolver resolves a ${secret:NAME} in a header value; the
// harness's secret chain (Redis, files, environment) is one.
type SecretResolver interface {
	Resolve(ctx context.Context, name string) (string, error)
}

// Redactor learns values that must never be stored or shown.
type Redactor interface {
	Add(values ...string)
}

// SharedCredentials gives a connection's discovery-scoped credential:
// that of its shared OAuth sign-in, never a user's own (the document is
// loaded once for everyone). ok is false when the connection has no
// sign-in; an error wrapping connect.ErrNeedsSignIn says nobody signed in
// for everyone yet. The OAuth sign-in service is one.
type SharedCredentials interface {
	SharedHeaders(ctx context.Context, connection string) (headers map[string]string, ok bool, err error)
}

var secretRefRE = regexp.MustCompile(`\$\{secret:([A-Za-z0-9._-]+)\}`)

// headers returns the entry's headers with every ${secret:NAME} resolved
// now, so a secret rotated through the API is used from the next call on.
// Each resolved value is handed to the redactor before it is sent.
func (p *Provider) headers(ctx context.Context) (map[string]string, error) {
	out := make(map[string]string, len(p.spec.Headers))
	for k, v := range p.spec.Headers {
		var err error
		v = secretRefRE.ReplaceAllStringFunc(v, func(ref string) string {
			name := secretRefRE.FindStringSubmatch(ref)[1]
			if p.opts.Secrets == nil {
				err = fmt.Errorf("header %s: no secret store to resolve ${secret:%s}", k, name)
				return ref
			}
			val, rerr := p.opts.Secrets.Resolve(ctx, name)
			if rerr != nil {
				// The store's errors never quote a value.
				err = fmt.Errorf("header %s: ${secret:%s}: %w", k, name, rerr)
				return ref
			}
			if p.opts.Redactor != nil {
				p.opts.Redactor.Add(val)
			}
			return val
		})
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}
