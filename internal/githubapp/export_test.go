package githubapp

// Keys returns the Redis keys (with the store prefix) of a scope's cached
// token and exchange lock, and its result channel, so tests can look at
// what the cluster shares.
func Keys(s *Source, scope Scope) (token, lock, channel string) {
	sc, err := scope.normalize()
	if err != nil {
		panic(err)
	}
	id := sc.cacheID(s.apiBase, s.appID)
	return s.store.Key(tokenName(id)), s.store.Key(lockName(id)), s.store.Key(channelName(id))
}
