package storetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeTimeout is the cluster-node-timeout (and, for Sentinel,
// down-after-milliseconds) of the servers started here: how long a dead
// master goes unnoticed before its replica is promoted.
const NodeTimeout = 2 * time.Second

// Server is one redis-server process started by a test.
type Server struct {
	// Addr is host:port on loopback.
	Addr string

	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

// Kill sends SIGKILL and waits for the process to be gone.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Client is a plain client to this one server.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// redisBinary is the path of redis-server, or the test is skipped (failed
// under CI=true, where nothing may be skipped).
func redisBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI requires %s (Debian: apt-get install redis-server): %v", name, err)
		}
		t.Skipf("%s not installed: %v", name, err)
	}
	return path
}

// freePort returns a loopback port that is free, with port+10000 (a
// cluster node's bus port) free too.
func freePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			_ = ln.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		_ = ln.Close()
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port
	}
	t.Fatal("no free port pair for a cluster node")
	return 0
}

// startServer runs bin (redis-server) with args on a free port, logging
// to a file in dir, and waits until it answers PING. A first argument
// that is not an option is a config file. Nothing is persisted.
func startServer(t testing.TB, bin, dir string, args ...string) *Server {
	t.Helper()
	port := freePort(t)
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{}), log: filepath.Join(dir, strconv.Itoa(port)+".log")}
	common := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--logfile", s.log}
	if len(args) > 0 && !strings.HasPrefix(args[0], "--") {
		// A config file must come first.
		common = append([]string{args[0]}, common...)
		args = args[1:]
	} else {
		// A replica's first sync starts at once (not after the 5 s a
		// diskless sync waits for more replicas), and its offset moves
		// within a second (a cluster lists a replica at offset 0 as not
		// yet available).
		common = append(common, "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1")
	}
	s.cmd = exec.Command(bin, append(common, args...)...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(s.Kill)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(s.log)
			t.Fatalf("redis-server on %s did not start:\n%s", s.Addr, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// Cluster is a Redis Cluster of redis-server processes on loopback: three
// masters with one replica each, cluster-node-timeout NodeTimeout.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts six redis-server processes with cluster-enabled,
// joins them with redis-cli --cluster create (three masters, one replica
// each) and waits until every node sees the cluster ok and every replica
// is in sync. All are killed when t ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin, cli := redisBinary(t, "redis-server"), redisBinary(t, "redis-cli")
	dir := t.TempDir()
	c := &Cluster{}
	addrs := make([]string, 6)
	for i := range addrs {
		n := startServer(t, bin, dir, "--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout.Milliseconds())))
		c.Nodes = append(c.Nodes, n)
		addrs[i] = n.Addr
	}
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		rc := n.Client(t)
		for !nodeReady(ctx, rc) {
			if time.Now().After(deadline) {
				info, _ := rc.ClusterInfo(ctx).Result()
				t.Fatalf("cluster node %s not ready:\n%s", n.Addr, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// nodeReady reports whether a node sees the cluster ok, knows all six
// nodes and a replica for each master, and, if a replica, has finished
// its sync.
func nodeReady(ctx context.Context, c *redis.Client) bool {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:6") {
		return false
	}
	// Every node must know which replica follows which master: go-redis
	// takes the slot map from any node.
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil || len(slots) != 3 {
		return false
	}
	for _, s := range slots {
		if len(s.Nodes) != 2 {
			return false
		}
	}
	repl, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return false
	}
	if strings.Contains(repl, "role:slave") {
		return strings.Contains(repl, "master_link_status:up") && strings.Contains(repl, "master_sync_in_progress:0")
	}
	return true
}

// URL is the redis+cluster:// URL naming every node as a seed.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// node is the server at addr.
func (c *Cluster) node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// MasterOf returns the master serving key's slot and its replica, as the
// first node asked sees them.
func (c *Cluster) MasterOf(t testing.TB, key string) (master, replica *Server) {
	t.Helper()
	ctx := context.Background()
	rc := c.Nodes[0].Client(t)
	slot, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) == 2 {
			return c.node(s.Nodes[0].Addr), c.node(s.Nodes[1].Addr)
		}
	}
	t.Fatalf("no master with a replica serves slot %d: %+v", slot, slots)
	return nil, nil
}

// WaitMaster polls s (every 10 ms, up to timeout) until it says it is a
// master, and returns when it first did; the zero time if it never did.
func WaitMaster(t testing.TB, s *Server, timeout time.Duration) time.Time {
	t.Helper()
	rc := s.Client(t)
	ctx := context.Background()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		role, err := rc.Do(ctx, "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			return time.Now()
		}
	}
	return time.Time{}
}

// Sentinel is a master with one replica watched by one sentinel (quorum
// 1, down-after-milliseconds NodeTimeout), all redis-server processes on
// loopback.
type Sentinel struct {
	Master, Replica, Sentinel *Server
}

// SentinelMaster is the name the sentinel knows the master by.
const SentinelMaster = "pbmaster"

// StartSentinel starts the master, its replica and the sentinel, and
// waits until the replica is in sync and the sentinel knows it. All are
// killed when t ends.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin := redisBinary(t, "redis-server")
	dir := t.TempDir()
	s := &Sentinel{}
	s.Master = startServer(t, bin, dir)
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	s.Replica = startServer(t, bin, dir, "--replicaof", host, port)
	conf := filepath.Join(dir, "sentinel.conf")
	lines := []string{
		fmt.Sprintf("sentinel monitor %s %s %s 1", SentinelMaster, host, port),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMaster, NodeTimeout.Milliseconds()),
		fmt.Sprintf("sentinel failover-timeout %s 10000", SentinelMaster),
	}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A sentinel rewrites its config file, so it needs one.
	s.Sentinel = startServer(t, bin, dir, conf, "--sentinel")
	ctx := context.Background()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr, MaxRetries: -1})
	defer sc.Close()
	rc := s.Replica.Client(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		repl, _ := rc.Info(ctx, "replication").Result()
		replicas, _ := sc.Replicas(ctx, SentinelMaster).Result()
		if strings.Contains(repl, "master_link_status:up") && len(replicas) == 1 && !strings.Contains(replicas[0]["flags"], "down") {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel not ready: replica %q, sentinel sees %v", repl, replicas)
		}
	}
}

// URL is the redis+sentinel:// URL of the master through the sentinel.
func (s *Sentinel) URL() string {
	return "redis+sentinel://" + s.Sentinel.Addr + "/" + SentinelMaster
}

// WaitSwitched polls the sentinel (every 10 ms, up to timeout) until it
// names the replica as the master, and returns when it first did; the
// zero time if it never did.
func (s *Sentinel) WaitSwitched(t testing.TB, timeout time.Duration) time.Time {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr, MaxRetries: -1})
	defer sc.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		addr, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == s.Replica.Addr {
			return time.Now()
		}
	}
	return time.Time{}
}
