package triggers

import (
	"context"
	"errors"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// profileEvent is the definition of an event of type typ in a profile the
// connection speaks (declared by its server or given by a binding), nil
// when none defines it. A server that declares its profiles is known to
// speak them once it has connected.
func (s *Service) profileEvent(connection, typ string) *profiles.Event {
	if s.reg == nil {
		return nil
	}
	c, err := s.reg.Get(connection)
	if err != nil {
		return nil
	}
	for _, sp := range c.Profiles() {
		if sp.Profile == nil {
			continue
		}
		if e, ok := sp.Profile.Events[typ]; ok {
			return e
		}
	}
	return nil
}

// naturalThread is the thread the connection's profile gives ev (the
// thread of a chat message), "" when it gives none. A trigger without a
// thread expression puts the event's turn on it.
func (s *Service) naturalThread(ctx context.Context, ev Event) (string, error) {
	e := s.profileEvent(ev.Connection, ev.Type)
	if e == nil {
		return "", nil
	}
	return e.ThreadOf(ctx, ev.Payload)
}

// checkProfilePayload validates the payload of an event its connection's
// profile defines against the profile's payload schema.
func (s *Service) checkProfilePayload(connection string, ev Event) error {
	e := s.profileEvent(connection, ev.Type)
	if e == nil {
		return nil
	}
	err := e.CheckPayload(ev.Payload)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		return &EventError{Problems: schemaProblems(ve)}
	}
	return &EventError{Problems: []FieldProblem{{"/payload", fmt.Sprintf("does not match the profile's event %s: %v", ev.Type, err)}}}
}
