package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Config configures a Coordinator. Zero values mean the documented default.
type Config struct {
	// DataDir holds the JetStream store (DataDir/jetstream unless StoreDir
	// is set) and the evidence folders (DataDir/runs/<run>). Required.
	DataDir string
	// StoreDir, when set, is the JetStream store instead of
	// DataDir/jetstream (`shardpool run` keeps one store per run, so that
	// runs of different names can share a state directory at once).
	StoreDir string
	// Listen is the host:port of the NATS listener for workers and the nats
	// CLI. Default "127.0.0.1:4222"; port 0 picks a free port.
	Listen string
	// HTTP is the host:port of the status server; "" disables it.
	HTTP string
	// Sync is how the store reaches the disk: stream.SyncGroup (default),
	// stream.SyncAlways or stream.SyncNone; see docs/decisions.md.
	Sync string
	// NoSync is the older spelling of Sync = stream.SyncNone.
	NoSync bool
	// LeaseTTL is the lease bucket TTL and consumer AckWait. Default 30s.
	LeaseTTL time.Duration
	// ReadyTimeout bounds the wait for JetStream health. Default 30s, or
	// 5 minutes in a cluster, whose coordinators are often started one
	// by one by hand and wait for a majority of them.
	ReadyTimeout time.Duration
	// StoreEvery is the period of the check that the store has room
	// (StoreFull). Default 2s.
	StoreEvery time.Duration
	// ReloadOnWriteError makes Run return ErrReload once a store that met
	// a write error has room again (see StoreFull); the caller then starts
	// a new Coordinator on the same data. Without it the store stays full
	// until the process restarts.
	ReloadOnWriteError bool
	// Auth makes every client but the coordinator's own present a token:
	// the one in StoreDir/token (TokenName), made at the first start and
	// kept. Off, any client that reaches Listen is taken (tests).
	Auth bool
	// TLS serves Listen and HTTP over TLS, with a certificate issued by
	// the store's own certificate authority: StoreDir/ca.pem (CAName),
	// which clients pin, made at the first start and kept with its key
	// (readable by this user alone). The coordinator's own connection is
	// in-process and does not use it. Off, traffic (the token with it)
	// crosses the network in the clear.
	TLS bool
	// Cluster, when set, is this coordinator's route listener (HOST:PORT)
	// in a NATS cluster of coordinators, and Peers the route addresses of
	// the others (HOST:PORT each; this one's own may be among them). The
	// SHARDS stream and every bucket are replicated on three of them
	// (Replicas), every write is acknowledged by a majority, and any one
	// coordinator may be lost without losing a write or stopping the
	// runs. A cluster needs at least three; see docs/decisions.md.
	Cluster string
	Peers   []string
	// Name is this coordinator's server name, unique in its cluster.
	// Default "shardpool" alone, or host-port of Cluster in a cluster.
	Name string
	// TokenFile, when set, holds the token clients present instead of
	// StoreDir/token (made there if missing): the coordinators of a
	// cluster share one, and routes between them present it too.
	// Requires Auth.
	TokenFile string
	// Brief, when set, names a holder of the store for a moment (a
	// `shardpool forget` of a run no coordinator serves): its lock file
	// says so, and a coordinator that starts on the store meanwhile waits
	// for it (up to BriefWait) instead of refusing with ErrDataInUse.
	Brief string
	// Logger receives structured logs; default discards.
	Logger *slog.Logger
}

// clusterName is the NATS cluster's name.
const clusterName = "shardpool"

// clusterReplicas is how many copies a cluster keeps of every stream and
// bucket: a majority of 2 survives the loss of any one coordinator.
const clusterReplicas = 3

// Coordinator is an embedded JetStream server plus run tracking.
type Coordinator struct {
	cfg   Config
	log   *slog.Logger
	srv   *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	token string // clients present it (Config.Auth); "" when none is asked
	http  *http.Server
	hl    net.Listener
	b     *stream.Buckets

	// storeSync makes the whole file system under the JetStream store
	// durable (syncfs) for barrier requests, shared with this process's
	// other syncfs of that file system (stream.FSSync).
	storeSync   *stream.FSSync
	storeClosed bool // storeSync given up (Close)
	sub         *nats.Subscription
	// lock holds the store for this coordinator (see lockData).
	lock *os.File
	// opts are the server's options as first given, for a reload that
	// raises the store limit (store.go); only watchStore uses them.
	opts *server.Options
	// storeFull is why the store refuses writes, or "" (store.go).
	storeFull atomic.Value
	// writeErr is the first write error nats-server's file store logged, or
	// "": that stream refuses every write from then on (store.go).
	writeErr atomic.Value
}

// New validates cfg. It does no I/O.
func New(cfg Config) (*Coordinator, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("%w: DataDir is required", ErrConfig)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:4222"
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("%w: Listen %q: %v", ErrConfig, cfg.Listen, err)
	}
	if cfg.HTTP != "" {
		if _, _, err := net.SplitHostPort(cfg.HTTP); err != nil {
			return nil, fmt.Errorf("%w: HTTP %q: %v", ErrConfig, cfg.HTTP, err)
		}
	}
	if cfg.NoSync && cfg.Sync == "" {
		cfg.Sync = stream.SyncNone
	}
	if cfg.Sync == "" {
		cfg.Sync = stream.SyncGroup
	}
	if !stream.ValidSync(cfg.Sync) || (cfg.NoSync && cfg.Sync != stream.SyncNone) {
		return nil, fmt.Errorf("%w: Sync %q must be %s, %s or %s", ErrConfig, cfg.Sync, stream.SyncGroup, stream.SyncAlways, stream.SyncNone)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = stream.DefaultLeaseTTL
	}
	if cfg.LeaseTTL < time.Second {
		return nil, fmt.Errorf("%w: LeaseTTL %s is below 1s", ErrConfig, cfg.LeaseTTL)
	}
	if cfg.StoreEvery <= 0 {
		cfg.StoreEvery = 2 * time.Second
	}
	if cfg.ReadyTimeout <= 0 && cfg.Cluster != "" {
		cfg.ReadyTimeout = 5 * time.Minute
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Cluster != "" {
		h, p, err := net.SplitHostPort(cfg.Cluster)
		if err != nil {
			return nil, fmt.Errorf("%w: Cluster %q: %v", ErrConfig, cfg.Cluster, err)
		}
		var peers []string
		for _, peer := range cfg.Peers {
			if _, _, err := net.SplitHostPort(peer); err != nil {
				return nil, fmt.Errorf("%w: peer %q: %v", ErrConfig, peer, err)
			}
			if peer != cfg.Cluster {
				peers = append(peers, peer)
			}
		}
		if len(peers)+1 < clusterReplicas {
			return nil, fmt.Errorf("%w: a cluster of coordinators needs at least %d (this one and %d peers), got %d peer(s): with fewer, losing one stops every run", ErrConfig, clusterReplicas, clusterReplicas-1, len(peers))
		}
		cfg.Peers = peers
		if cfg.Name == "" {
			host, _ := os.Hostname()
			if h != "" && h != "0.0.0.0" && h != "::" {
				host = h
			}
			cfg.Name = host + "-" + p
		}
		// A majority of copies acknowledges every write; fsync at each is
		// what SyncAlways adds (docs/decisions.md). Group sync's barrier
		// is one store's syncfs and cannot speak for a majority.
		if cfg.Sync == stream.SyncGroup {
			cfg.Sync = stream.SyncAlways
		}
	} else if len(cfg.Peers) > 0 {
		return nil, fmt.Errorf("%w: Peers without Cluster: give this coordinator's own route listener", ErrConfig)
	}
	if cfg.Name == "" {
		cfg.Name = "shardpool"
	}
	if cfg.TokenFile != "" && !cfg.Auth {
		return nil, fmt.Errorf("%w: TokenFile without Auth", ErrConfig)
	}
	abs, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("%w: DataDir: %v", ErrConfig, err)
	}
	cfg.DataDir = abs
	if cfg.StoreDir == "" {
		cfg.StoreDir = filepath.Join(abs, "jetstream")
	}
	if cfg.StoreDir, err = filepath.Abs(cfg.StoreDir); err != nil {
		return nil, fmt.Errorf("%w: StoreDir: %v", ErrConfig, err)
	}
	return &Coordinator{cfg: cfg, log: cfg.Logger.With("component", "coordinator")}, nil
}

// Start starts the embedded server, waits until JetStream is healthy (not
// only listening), connects in-process and creates the layout.
func (c *Coordinator) Start(ctx context.Context) error {
	host, portS, _ := net.SplitHostPort(c.cfg.Listen)
	port, err := strconv.Atoi(portS)
	if err != nil {
		return fmt.Errorf("%w: Listen port %q", ErrConfig, portS)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	// nats-server logs a port in use and never listens: say so now,
	// instead of after ReadyTimeout as "no listener".
	if port != server.RANDOM_PORT {
		if err := portFree(c.cfg.Listen, "--listen"); err != nil {
			return err
		}
	}
	if c.cfg.HTTP != "" {
		if err := portFree(c.cfg.HTTP, "--http"); err != nil {
			return err
		}
	}
	// A route listener in use was the same: logged by nats-server, then
	// five minutes of "Waiting for routing to be established" (the
	// cluster's ReadyTimeout) before "no listener".
	if _, p, _ := net.SplitHostPort(c.cfg.Cluster); c.cfg.Cluster != "" && p != "0" {
		if err := portFree(c.cfg.Cluster, "--cluster"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(c.cfg.StoreDir, 0o755); err != nil {
		return fmt.Errorf("start coordinator: %w", err)
	}
	lock, holder, err := lockData(c.cfg.StoreDir, c.cfg.Brief)
	if err != nil {
		return fmt.Errorf("start coordinator: %w", err)
	}
	c.lock = lock
	if c.cfg.Auth {
		// A --token-file's directory is made too, private: a cluster's
		// authority is made there (the store's exists by now).
		if err := os.MkdirAll(filepath.Dir(c.TokenFile()), 0o700); err != nil {
			c.Close()
			return fmt.Errorf("start coordinator: %w", err)
		}
		if c.token, err = loadOrCreateToken(c.TokenFile()); err != nil {
			c.Close()
			return fmt.Errorf("start coordinator: %w", err)
		}
	}
	var tlsCfg, routeTLS *tls.Config
	if c.cfg.TLS {
		httpHost, _, _ := net.SplitHostPort(c.cfg.HTTP)
		clusterHost, _, _ := net.SplitHostPort(c.cfg.Cluster)
		if tlsCfg, routeTLS, err = serverTLS(c.caDir(), host, httpHost, clusterHost); err != nil {
			c.Close()
			return fmt.Errorf("start coordinator: %w", err)
		}
	}
	maxStore, err := storeLimit(c.cfg.StoreDir)
	if err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	opts := &server.Options{
		ServerName:         c.cfg.Name,
		Host:               host,
		Port:               port,
		JetStream:          true,
		StoreDir:           c.cfg.StoreDir,
		SyncAlways:         c.cfg.Sync == stream.SyncAlways,
		NoSigs:             true,
		MaxPayload:         8 << 20,
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  maxStore,
		Authorization:      c.token, // "" with Auth off: no authorization
		TLSConfig:          tlsCfg,  // nil with TLS off
		TLSTimeout:         5,
	}
	if c.cfg.Cluster != "" {
		ch, cp, _ := net.SplitHostPort(c.cfg.Cluster)
		cport, err := strconv.Atoi(cp)
		if err != nil {
			c.Close()
			return fmt.Errorf("%w: Cluster port %q", ErrConfig, cp)
		}
		opts.Cluster = server.ClusterOpts{Name: clusterName, Host: ch, Port: cport}
		if routeTLS != nil {
			opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = routeTLS, 5
		}
		creds := ""
		if c.token != "" {
			// Routes present the clients' token: a process that can reach
			// the route port cannot join without it.
			opts.Cluster.Username, opts.Cluster.Password = "shardpool", c.token
			creds = "shardpool:" + c.token + "@"
		}
		var routes []string
		for _, p := range c.cfg.Peers {
			routes = append(routes, "nats-route://"+creds+p)
		}
		opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
	}
	c.opts = opts.Clone() // NewServer adjusts what it is given
	srv, err := server.NewServer(opts)
	if err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	srv.SetLoggerV2(natsLogger{l: c.cfg.Logger.With("component", "nats"), onWriteErr: c.noteWriteError}, false, false, false)
	srv.Start()
	c.srv = srv
	// Waited for in steps, so that a stop (SIGTERM, Ctrl-C) ends the wait
	// at once: a listener that never comes up (its port taken between
	// portFree and the server's bind, as a soak's picked ports once were)
	// held the command for ReadyTimeout, five minutes in a cluster.
	for began := time.Now(); !srv.ReadyForConnections(min(time.Second, c.cfg.ReadyTimeout)); {
		if ctx.Err() != nil {
			c.Close()
			return fmt.Errorf("start coordinator: %w", ctx.Err())
		}
		if time.Since(began) >= c.cfg.ReadyTimeout {
			c.Close()
			return fmt.Errorf("start coordinator: %w: no listener after %s", ErrNotReady, c.cfg.ReadyTimeout)
		}
	}
	if err := c.waitHealthy(ctx); err != nil {
		c.Close()
		return err
	}
	copts := []nats.Option{nats.InProcessServer(srv), nats.Name("shardpool-coordinator"), nats.MaxReconnects(-1)}
	if c.token != "" {
		copts = append(copts, nats.Token(c.token))
	}
	nc, err := nats.Connect("", copts...)
	if err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: connect in-process: %w", err)
	}
	c.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	c.js = js
	if err := c.setup(ctx, js); err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	b, err := stream.OpenBuckets(ctx, js)
	if err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	c.b = b
	shards, err := js.Stream(ctx, stream.StreamShards)
	if err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	if err := c.startSyncer(shards.CachedInfo().Created.UTC().Format("20060102T150405.000000000Z")); err != nil {
		c.Close()
		return fmt.Errorf("start coordinator: %w", err)
	}
	if c.cfg.HTTP != "" {
		l, err := net.Listen("tcp", c.cfg.HTTP)
		if err != nil {
			c.Close()
			return fmt.Errorf("start coordinator: http listen: %w", err)
		}
		if tlsCfg != nil {
			l = tls.NewListener(l, tlsCfg)
		}
		c.hl = l
		c.http = &http.Server{Handler: c.routes(), ReadHeaderTimeout: 5 * time.Second}
	}
	// Below the holder line, the lock file says where the store is served, for
	// `shardpool status --data` (LiveIn).
	where := "url " + c.ClientURL() + "\n"
	if c.cfg.TLS {
		where += "tls\n"
	}
	if c.cfg.TokenFile != "" {
		// Not in the store: status --data finds them here.
		where += "token " + c.TokenFile() + "\n"
		if c.cfg.TLS {
			where += "ca " + c.CAFile() + "\n"
		}
	}
	_, _ = c.lock.WriteAt([]byte(where), int64(len(holder)))
	c.log.Info("coordinator ready", "url", c.ClientURL(), "data", c.cfg.DataDir, "sync", c.cfg.Sync)
	return nil
}

// setup creates the layout. In a cluster every coordinator tries, and
// until the cluster has elected its meta leader and met its peers the
// JetStream API answers with errors: they are tried again until
// ReadyTimeout.
func (c *Coordinator) setup(ctx context.Context, js jetstream.JetStream) error {
	layout := stream.Layout{LeaseTTL: c.cfg.LeaseTTL}
	if c.cfg.Cluster == "" {
		return stream.Setup(ctx, js, layout)
	}
	layout.Replicas = clusterReplicas
	deadline := time.Now().Add(c.cfg.ReadyTimeout)
	for {
		// The meta leader creates the layout; the others wait for it to
		// exist (concurrent creations of one stream stall each other).
		var err error
		if c.srv.JetStreamIsLeader() {
			err = stream.Setup(ctx, js, layout)
		} else if _, err = stream.OpenBuckets(ctx, js); err == nil {
			_, err = js.Stream(ctx, stream.StreamShards)
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		c.log.Debug("cluster layout not ready", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Coordinator) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(c.cfg.ReadyTimeout)
	for {
		hs := c.srv.Healthz(&server.HealthzOptions{})
		if hs != nil && hs.Status == "ok" && c.srv.JetStreamEnabled() {
			return nil
		}
		if time.Now().After(deadline) {
			reason := "unknown"
			if hs != nil {
				reason = hs.Error
			}
			if c.cfg.Cluster != "" {
				reason += fmt.Sprintf(" (after %s connected to %d of its %d peers: a cluster serves once a majority of its coordinators run and reach each other's --cluster listeners with the same token)",
					c.cfg.ReadyTimeout, c.connectedPeers(), len(c.cfg.Peers))
			}
			return fmt.Errorf("start coordinator: %w: %s", ErrNotReady, reason)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Run tracks runs and serves HTTP until ctx ends, then shuts everything down.
// It returns after every goroutine it started has exited.
func (c *Coordinator) Run(ctx context.Context) error {
	if c.srv == nil {
		return fmt.Errorf("run coordinator: %w: Start was not called", ErrConfig)
	}
	defer c.Close()
	g, gctx := errgroup.WithContext(ctx)
	if c.cfg.Cluster == "" {
		t := newTracker(c)
		g.Go(func() error { return t.run(gctx) })
	} else {
		g.Go(func() error { return c.trackWhileLeader(gctx) })
	}
	g.Go(func() error { return c.watchStore(gctx, c.cfg.StoreEvery) })
	if c.http != nil {
		g.Go(func() error {
			if err := c.http.Serve(c.hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return c.http.Shutdown(sctx)
		})
	}
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// connectedPeers is how many other coordinators this one has a route to.
func (c *Coordinator) connectedPeers() int {
	rz, err := c.srv.Routez(&server.RoutezOptions{})
	if err != nil {
		return 0
	}
	seen := map[string]bool{}
	for _, r := range rz.Routes {
		seen[r.RemoteID] = true
	}
	return len(seen)
}

// trackWhileLeader runs the tracker on the cluster's meta leader only:
// one coordinator judges the runs and writes their evidence at a time.
// When leadership moves, the new leader's tracker starts from the shard
// records, as after a restart.
func (c *Coordinator) trackWhileLeader(ctx context.Context) error {
	var stop context.CancelFunc
	var done chan struct{}
	defer func() {
		if stop != nil {
			stop()
			<-done
		}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		leader := c.srv.JetStreamIsLeader()
		if done != nil {
			select {
			case <-done: // ended by an error: start again while leader
				stop, done = nil, nil
			default:
			}
		}
		switch {
		case leader && done == nil:
			c.log.Info("cluster: this coordinator leads; tracking runs", "name", c.cfg.Name)
			tctx, cancel := context.WithCancel(ctx)
			stop, done = cancel, make(chan struct{})
			go func(done chan struct{}) {
				defer close(done)
				if err := newTracker(c).run(tctx); err != nil && tctx.Err() == nil {
					c.log.Warn("cluster: tracker stopped; starting again", "err", err)
				}
			}(done)
		case !leader && done != nil:
			c.log.Info("cluster: leadership moved; tracking stops here", "name", c.cfg.Name)
			stop()
			<-done
			stop, done = nil, nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Close shuts the connection and the server down; it is idempotent.
func (c *Coordinator) Close() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.srv != nil {
		c.srv.Shutdown()
		c.srv.WaitForShutdown()
	}
	if c.storeSync != nil && !c.storeClosed {
		// Kept set: a barrier asked after Close fails on the closed
		// file, or is served by another user of the file system.
		c.storeSync.Close()
		c.storeClosed = true
	}
	if c.lock != nil {
		c.lock.Close() // releases the flock
		c.lock = nil
	}
}

// portFree binds addr and lets it go: an address in use (another
// coordinator's, or another program's) is named with the flag that
// changes it.
func portFree(addr, flag string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("start coordinator: %w: %s is in use (another coordinator, or another program): pass %s HOST:PORT%s", ErrConfig, addr, flag, anyFree(flag))
		}
		return fmt.Errorf("start coordinator: %w: %s: %v", ErrConfig, flag, err)
	}
	return l.Close()
}

// anyFree is the hint that port 0 takes any free port, for the listeners
// clients find through the coordinator's own output; not for a route
// listener, which its peers are given.
func anyFree(flag string) string {
	if flag == "--cluster" {
		return " (the one its peers name in their --peers)"
	}
	return ", port 0 for any free one"
}

// lockName is the lock file in a coordinator's store directory (beside
// the server's own jetstream/ folder).
const lockName = "coordinator.lock"

// lockData takes an exclusive flock on the store directory's lock file, so
// that no two coordinators (two `shardpool run` of one run, say) ever open
// the same JetStream store: nats-server does not guard its store
// directory, and two servers on one store corrupt it and run every shard
// twice. The kernel drops the lock when the process dies, however it dies.
// The file names the holder for the error the next one gets; brief, when
// set, marks a holder for a moment, which the next one waits for.
func lockData(dir, brief string) (*os.File, string, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, "", err
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	for i := 0; errors.Is(err, unix.EWOULDBLOCK) && i < lockTries && sharedOnly(path); i++ {
		// Someone looks (LiveIn's shared lock), nobody holds it.
		time.Sleep(lockPause)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	for waited := time.Duration(0); errors.Is(err, unix.EWOULDBLOCK); waited += briefPause {
		// A `forget` holds the store for a moment: a run starting on it
		// meanwhile starts after it rather than failing. A holder that
		// has not written its name yet is looked at again shortly.
		isBrief, named := holderBrief(path)
		waitBrief := isBrief && waited < BriefWait
		waitName := !named && waited < time.Second
		if !waitBrief && !waitName {
			break
		}
		time.Sleep(briefPause)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := strings.ReplaceAll(strings.TrimSpace(string(holder)), "\n", ", ")
			if who == "" {
				who = "a process that has not written its name yet"
			}
			return nil, "", fmt.Errorf("%w: the store %s is held by %s; stop it, or give this one another --data", ErrDataInUse, dir, who)
		}
		return nil, "", fmt.Errorf("lock %s: %w", path, err)
	}
	host, _ := os.Hostname()
	holder := fmt.Sprintf("pid %d on %s since %s", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	if brief != "" {
		holder += fmt.Sprintf(" %s (%s)", briefMark, brief)
	}
	holder += "\n"
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(holder), 0)
	}
	return f, holder, nil
}

// BriefWait bounds how long a coordinator starting on a store waits for a
// holder that holds it for a moment (Config.Brief): longer than any
// `forget` takes, short enough that a stuck one is reported.
var BriefWait = time.Minute

const (
	briefMark  = "for a moment"
	briefPause = 50 * time.Millisecond
)

// holderBrief reports whether the holder of the lock file at path says it
// holds the store for a moment only, and whether it has named itself yet.
func holderBrief(path string) (brief, named bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, true
	}
	first, _, _ := strings.Cut(string(data), "\n")
	return strings.Contains(first, " "+briefMark+" ("), strings.TrimSpace(first) != ""
}

// startSyncer opens the store for syncfs, makes what Setup wrote durable,
// and answers barrier requests on stream.SubjectSync: in group mode after
// a syncfs that began after the request arrived, otherwise at once (the
// server synced each write itself, or nothing is synced by choice).
func (c *Coordinator) startSyncer(store string) error {
	s, err := stream.OpenFSSync(c.srv.StoreDir())
	if err != nil {
		return fmt.Errorf("open store for sync: %w", err)
	}
	c.storeSync = s
	if err := c.Barrier(context.Background()); err != nil {
		return err
	}
	c.sub, err = c.nc.Subscribe(stream.SubjectSync, func(m *nats.Msg) {
		reply := func(err error) {
			reply := []byte("ok")
			if err != nil {
				c.log.Error("sync barrier", "err", err)
				reply = []byte("error: " + err.Error())
			}
			_ = m.Respond(reply)
		}
		if c.cfg.Sync != stream.SyncGroup {
			reply(nil)
			return
		}
		// A barrier before a message is settled may wait for others
		// (stream.SettleBarrier); any other at once: a worker on another
		// host waits for it before it starts a command.
		gather := time.Duration(0)
		if stream.MayGather(m.Data) {
			gather = s.Gather(settleGatherPer, 0, settleGather)
		}
		s.Go(gather, reply)
	})
	if err != nil {
		return fmt.Errorf("serve sync barrier: %w", err)
	}
	host, _ := os.Hostname()
	base := stream.CoordinatorInfo{Host: host, BootID: stream.BootID("/proc"), Sync: c.cfg.Sync, Store: store,
		PID: os.Getpid(), PIDNS: stream.PIDNamespace(), Version: stream.ThisBuild().Version}
	if c.cfg.Cluster != "" {
		base.Name, base.Cluster, base.Coordinators = c.cfg.Name, clusterName, len(c.cfg.Peers)+1
	}
	if st, err := probe.ReadStat("/proc", os.Getpid()); err == nil {
		base.Start = st.Start
	}
	if _, err := c.nc.Subscribe(stream.SubjectInfo, func(m *nats.Msg) {
		info := base
		info.StoreFull = c.StoreFull()
		info.Clients = c.clientNames()
		if c.cfg.Cluster != "" {
			info.Leader = c.metaLeader()
		}
		data, _ := stream.Encode(&info)
		_ = m.Respond(data)
	}); err != nil {
		return fmt.Errorf("serve info: %w", err)
	}
	// A subscription is only sent; until the server has it, a request from
	// another connection (a status run right after Start) finds no
	// responders. The flush's round trip means the server has both.
	if err := c.nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("serve info: %w", err)
	}
	return nil
}

// settleGather is how long a barrier that may wait (stream.SettleBarrier)
// lets its syncfs wait for others. Such barriers come after a command
// ended and its slot was given back, so the wait costs a slot nothing,
// and each syncfs saved is a flush of the whole disk, of other users'
// writes too. With the outputs' own gather (the worker's outputGather),
// 5,000 shards of /bin/true on this 2-core VM, 3 rounds: 7.1 s against
// 7.4 s with none, and 10.5-11.6 s before the two shared one syncfs.
// The wait is settleGatherPer times what a syncfs takes there, at most
// settleGather: where a flush is cheap, waiting only adds latency. Longer
// waits (8 times, at most 30 ms, with the outputs' 12 times, at most 60
// ms, and 256 attempts concluding at once) cut the syncfs calls by half
// again and the run's CPU with them: 5,000 shards in 4.5-6.1 s against
// 4.9-6.9 s, five rounds alternating (forty-second session). A worker
// with one shard in hand asks with no wait (stream.Barrier).
const (
	settleGather    = 30 * time.Millisecond
	settleGatherPer = 8
)

// Barrier makes every write acknowledged so far durable (see
// stream.SyncGroup); it shares its syncfs with concurrent barriers.
func (c *Coordinator) Barrier(ctx context.Context) error {
	if c.cfg.Sync != stream.SyncGroup {
		return nil
	}
	if err := c.storeSync.Do(ctx, 0); err != nil {
		return fmt.Errorf("%w: %v", stream.ErrNotDurable, err)
	}
	return nil
}

// ClientURL is the nats:// URL workers and the nats CLI connect to.
func (c *Coordinator) ClientURL() string { return c.srv.ClientURL() }

// HTTPAddr is the bound status address, or "" when HTTP is off.
func (c *Coordinator) HTTPAddr() string {
	if c.hl == nil {
		return ""
	}
	return c.hl.Addr().String()
}

// StatusURL is the URL of GET /status (https with Config.TLS), or "" when
// no HTTP listener was asked for.
func (c *Coordinator) StatusURL() string {
	if c.hl == nil {
		return ""
	}
	scheme := "http"
	if c.cfg.TLS {
		scheme = "https"
	}
	return scheme + "://" + c.hl.Addr().String() + "/status"
}

// JetStream is the coordinator's in-process JetStream client.
func (c *Coordinator) JetStream() jetstream.JetStream { return c.js }

// Conn is the coordinator's in-process connection.
func (c *Coordinator) Conn() *nats.Conn { return c.nc }

// DataDir is the absolute data directory.
func (c *Coordinator) DataDir() string { return c.cfg.DataDir }

// StoreDir is the JetStream store's directory.
func (c *Coordinator) StoreDir() string { return c.cfg.StoreDir }

// EvidenceDir is where a run's evidence lives.
func (c *Coordinator) EvidenceDir(run string) string {
	return filepath.Join(c.cfg.DataDir, "runs", run)
}

type natsLogger struct {
	l *slog.Logger
	// onWriteErr sees every error the server logs (noteWriteError).
	onWriteErr func(string)
}

func (n natsLogger) Noticef(f string, v ...any) { n.l.Debug(fmt.Sprintf(f, v...)) }
func (n natsLogger) Warnf(f string, v ...any)   { n.l.Warn(fmt.Sprintf(f, v...)) }
func (n natsLogger) Fatalf(f string, v ...any)  { n.l.Error(fmt.Sprintf(f, v...)) }
func (n natsLogger) Errorf(f string, v ...any) {
	msg := fmt.Sprintf(f, v...)
	n.l.Error(msg)
	if n.onWriteErr != nil {
		n.onWriteErr(msg)
	}
}
func (n natsLogger) Debugf(f string, v ...any) { n.l.Debug(fmt.Sprintf(f, v...)) }
func (n natsLogger) Tracef(f string, v ...any) {}

// clientNames lists the names of the server's open client connections,
// sorted, each once (its own in-process connection among them); nil when
// the server cannot say. In a cluster they are this coordinator's alone:
// a reader merges every coordinator's (stream.AskInfoAll).
func (c *Coordinator) clientNames() []string {
	cz, err := c.srv.Connz(&server.ConnzOptions{Limit: math.MaxInt32})
	if err != nil {
		return nil
	}
	var names []string
	for _, ci := range cz.Conns {
		if ci.Name != "" {
			names = append(names, ci.Name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// metaLeader is the server name of the cluster's JetStream meta leader,
// the coordinator that tracks the runs (trackWhileLeader); "" while none
// is elected, or when the server cannot say.
func (c *Coordinator) metaLeader() string {
	jsi, err := c.srv.Jsz(&server.JSzOptions{})
	if err != nil || jsi.Meta == nil {
		return ""
	}
	return jsi.Meta.Leader
}

// LoopbackPorts finds n distinct loopback HOST:PORTs nothing listens on,
// for coordinators (and a cluster's routes) started on this host by the
// drill and the tests. Each is held until all are found: one closed at
// once may be handed out again by the next listen (a cluster's three
// route ports came out with duplicates, and its coordinator refused a
// cluster of one peer). They are free a moment ago, not reserved.
//
// They are picked at random below the kernel's ephemeral range where it
// leaves room (the default range starts at 32768): a port the kernel
// picks for a listener on port 0 comes from the range it also gives
// outgoing connections, and a client's connection took a soak's picked
// port before its coordinator bound it.
func LoopbackPorts(n int) ([]string, error) {
	out := make([]string, 0, n)
	low := ephemeralLow()
	for range n {
		var l net.Listener
		var err error
		for try := 0; l == nil && low > 21000 && try < 100; try++ {
			l, _ = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(low-20000)))
		}
		if l == nil {
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, err
			}
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0
// where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0
	}
	low, _ := strconv.Atoi(f[0])
	return low
}
