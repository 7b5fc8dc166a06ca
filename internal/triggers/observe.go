package triggers

// DeadObserver is implemented by an Observer that counts the events moved
// to the dead letters.
type DeadObserver interface {
	DeadLettered(connection string)
}

func (s *Service) deadLettered(connection string) {
	if o, ok := s.observer.(DeadObserver); ok {
		o.DeadLettered(connection)
	}
}
