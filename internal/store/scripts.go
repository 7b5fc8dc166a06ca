package store

import "github.com/redis/go-redis/v9"

// RenewScript extends a lease key (KEYS[1]) by ARGV[2] milliseconds while
// it still holds the caller's token (ARGV[1]); it answers 1 when renewed
// and 0 when the lease is another's or gone. Execution claims and MCP
// event subscriptions share it.
var RenewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)
