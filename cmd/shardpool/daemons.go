package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

func cmdCoordinator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("coordinator", "shardpool coordinator --data DIR [--listen HOST:PORT] [--http HOST:PORT] [--tls on|off|auto] [--cluster HOST:PORT --peers HOST:PORT,... --token-file FILE]", stderr)
	data := fs.String("data", "", "state `DIR`: JetStream store and evidence (required)")
	listen := fs.String("listen", "127.0.0.1:4222", "NATS listener (`HOST:PORT`) for workers and the nats CLI")
	httpAddr := fs.String("http", "127.0.0.1:8222", "GET /status and /metrics (Prometheus) listener, `HOST:PORT` (empty to disable)")
	leaseTTL := fs.Duration("lease-ttl", stream.DefaultLeaseTTL, "lease TTL and ack wait")
	syncMode := registerSync(fs)
	tlsMode := registerTLS(fs)
	cluster := fs.String("cluster", "", "this coordinator's route listener `HOST:PORT` in a cluster of coordinators (at least 3; each with --peers)")
	peers := fs.String("peers", "", "`PEERS`: the other coordinators' route listeners (their --cluster), HOST:PORT,... comma-separated")
	name := fs.String("name", "", "this coordinator's `NAME` in its cluster (default HOST-PORT of --cluster)")
	tokenFile := fs.String("token-file", "", "`FILE` holding the token clients and the other coordinators present, instead of DATA/jetstream/token (made if missing); with TLS the certificate authority is made beside it (ca.pem, ca-key.pem): the coordinators of a cluster share the directory, or copies of the three files")
	verbose := fs.Bool("v", false, "debug logs")
	if err := parseNone(fs, args); err != nil {
		return err
	}
	if *data == "" {
		fmt.Fprintln(fs.Output(), "shardpool coordinator: --data DIR is required: the directory of its store and evidence")
		fs.Usage()
		return errUsage
	}
	// Routes beyond loopback carry every record and the token, as the
	// client listener does.
	useTLS, err := tlsOn(*tlsMode, *listen, *httpAddr, *cluster)
	if err != nil {
		return err
	}
	var peerList []string
	if *peers != "" {
		peerList = strings.Split(*peers, ",")
	}
	if *cluster != "" && *tokenFile == "" {
		return exitErr{code: exitUsage, msg: "coordinator: --cluster needs --token-file FILE, the same file (or a copy) for every coordinator of the cluster: clients and the other coordinators present its token, and with TLS the cluster's certificate authority is made beside it"}
	}
	for {
		c, err := coordinator.New(coordinator.Config{DataDir: *data, Listen: *listen, HTTP: *httpAddr, Sync: string(*syncMode),
			LeaseTTL: *leaseTTL, ReloadOnWriteError: true, Auth: true, TLS: useTLS, Cluster: *cluster, Peers: peerList, Name: *name,
			TokenFile: absOrEmpty(*tokenFile), Logger: logger(stderr, *verbose, slog.LevelInfo)})
		if err != nil {
			return err
		}
		checkStore(ctx, c.StoreDir(), stderr)
		if err := c.Start(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "coordinator ready: nats %s", c.ClientURL())
		if u := c.StatusURL(); u != "" {
			fmt.Fprintf(stdout, ", status %s, metrics %s", u, metricsURL(u))
		}
		fmt.Fprintf(stdout, ", data %s (shardpool %s)\n", c.DataDir(), stream.ThisBuild().Version)
		printAccess(stdout, c)
		err = c.Run(ctx)
		if err == nil && ctx.Err() != nil {
			fmt.Fprintln(stdout, coordinatorStopped(ctx, c.DataDir()))
		}
		if !errors.Is(err, coordinator.ErrReload) {
			return err
		}
		// The store met a full disk and has room again: a new server
		// loads it afresh on the same listeners; workers reconnect.
		fmt.Fprintf(stdout, "coordinator: the store met a write error and has room again: reloading it\n")
	}
}

// coordinatorStopped is what a coordinator says once a signal has
// stopped it: nothing of its runs is lost, and how to go on. Workers
// print that they lost it; without this line its own output ended at
// its last run state, as if it had died.
func coordinatorStopped(ctx context.Context, data string) string {
	why := "stopped"
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		why = "stopped by " + cause.Error()
	}
	return fmt.Sprintf("coordinator %s: the store and every run's state stay in %s; `shardpool coordinator --data %s` (with the same flags) goes on where it stopped, and workers reconnect by themselves",
		why, data, shellQuote(data))
}

// absOrEmpty is absPath of a path given, "" of none.
func absOrEmpty(p string) string {
	if p == "" {
		return ""
	}
	return absPath(p)
}

// metricsURL is the /metrics URL beside a /status URL.
func metricsURL(status string) string { return strings.TrimSuffix(status, "/status") + "/metrics" }

// printAccess says which files clients need, and how the nats CLI and
// curl use them; the token itself is never printed.
func printAccess(w io.Writer, c *coordinator.Coordinator) {
	tf := shellQuote(c.TokenFile())
	if c.CAFile() == "" {
		fmt.Fprintf(w, "clients present the token in %s: workers, submit and status with --token-file %s; the nats CLI with NATS_URL=nats://$(cat %s)@HOST:PORT\n",
			c.TokenFile(), tf, tf)
		return
	}
	ca := shellQuote(c.CAFile())
	fmt.Fprintf(w, "TLS: clients pin the certificate authority in %s and present the token in %s (copy both to the workers' hosts): workers, submit and status with --token-file %s --tls-ca %s; the nats CLI with NATS_URL=nats://$(cat %s)@HOST:PORT nats --tlsca %s\n",
		c.CAFile(), c.TokenFile(), tf, ca, tf, ca)
}

// connect opens a connection to the coordinator at url. With wait > 0 a
// coordinator that does not answer yet is tried again until wait has
// passed (a worker started by a scheduler beside its coordinator), saying
// so once on notice; once connected, a connection outlives coordinator
// restarts. Where it pins the authority found beside the token file, it
// sets acc.ca to it: the commands a client writes down (resume.txt) then
// name the files it really used.
func connect(ctx context.Context, url string, acc *access, name string, wait time.Duration, notice io.Writer, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	deadline := time.Now().Add(wait)
	pause := 250 * time.Millisecond
	tokenFile := acc.token
	opts := append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(500 * time.Millisecond),
		nats.Timeout(5 * time.Second), nats.RetryOnFailedConnect(false)}, extra...)
	if tokenFile != "" {
		opts = append(opts, nats.TokenHandler(coordinator.TokenReader(tokenFile)))
	}
	if acc.ca != "" {
		// TLS is required, not only taken when offered: a client that
		// pins a certificate would otherwise send its token to whatever
		// answers in the clear.
		tc, err := coordinator.ClientTLS(acc.ca)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-ca: %w", err)
		}
		opts = append(opts, nats.Secure(tc))
	}
	var nc *nats.Conn
	for {
		var missing, caMissing error
		if acc.ca != "" {
			// Waited for as the token is.
			if _, err := os.Stat(acc.ca); errors.Is(err, os.ErrNotExist) {
				caMissing = err
			}
		}
		if tokenFile != "" {
			// A coordinator started at the same time (by a scheduler)
			// writes its token when it starts: while nothing answers, a
			// missing file is waited for as the coordinator is.
			if _, err := coordinator.ReadToken(tokenFile); errors.Is(err, os.ErrNotExist) {
				missing = err
			} else if err != nil {
				return nil, nil, fmt.Errorf("--token-file: %w", err)
			}
		}
		var err error
		nc, err = nats.Connect(url, opts...)
		if err == nil {
			break
		}
		if isAuthError(err) {
			why := "pass --token-file FILE (or set SHARDPOOL_TOKEN_FILE): a coordinator keeps its token in DATA/jetstream/token of its --data, a `shardpool run` in DATA/stores/<run>/token, readable by its user alone"
			switch {
			case missing != nil:
				why = fmt.Sprintf("--token-file: %v; is that the file under its --data?", missing)
			case tokenFile != "":
				why = fmt.Sprintf("the token in %s is not this coordinator's", tokenFile)
			}
			return nil, nil, fmt.Errorf("the coordinator at %s refused this connection (%w): %s", redactURL(url), err, why)
		}
		switch {
		case caMissing != nil && !errors.Is(err, nats.ErrNoServers):
			return nil, nil, fmt.Errorf("the coordinator at %s answers, and --tls-ca %s is missing (%v): copy its ca.pem there (DATA/jetstream/ca.pem of its --data)", redactURL(url), acc.ca, caMissing)
		case acc.ca == "" && isCertError(err):
			// The coordinator asks for TLS (nothing was sent yet): its
			// authority beside the token, where the token was copied
			// with it, is the one to pin.
			if beside := filepath.Join(filepath.Dir(tokenFile), coordinator.CAName); tokenFile != "" && fileExists(beside) {
				pinned := access{token: tokenFile, ca: beside}
				nc, js, err := connect(ctx, url, &pinned, name, time.Until(deadline), notice, extra...)
				if err == nil {
					*acc = pinned
				}
				return nc, js, err
			}
			return nil, nil, fmt.Errorf("%w at %s (%v): pass --tls-ca FILE (or set SHARDPOOL_TLS_CA), or keep it as ca.pem beside the token file: its certificate authority, DATA/jetstream/ca.pem of a coordinator's --data, DATA/stores/<run>/ca.pem of a `shardpool run`, copied with the token",
				errNeedsTLS, redactURL(url), err)
		case acc.ca != "" && isCertTimeError(err):
			return nil, nil, fmt.Errorf("the coordinator at %s: %v", redactURL(url), err)
		case acc.ca != "" && isCertError(err):
			return nil, nil, fmt.Errorf("the coordinator at %s is not the one whose certificate authority is %s (%v): is it another coordinator, or was its store made anew? Copy its ca.pem again", redactURL(url), acc.ca, err)
		case errors.Is(err, nats.ErrSecureConnWanted):
			return nil, nil, fmt.Errorf("the coordinator at %s does not serve TLS, and --tls-ca %s asks for it: start the coordinator with --tls on, or leave --tls-ca out where traffic stays on a trusted network", redactURL(url), acc.ca)
		case !errors.Is(err, nats.ErrNoServers):
			return nil, nil, fmt.Errorf("connect %s: %w", redactURL(url), err)
		}
		if !time.Now().Add(pause).Before(deadline) {
			why := "is `shardpool coordinator` running there? A `shardpool run` serves its coordinator only while it runs; `shardpool status --data DATA` finds a live one, or reports each run's last verdict from DATA/runs/<run>/final.json"
			if wait > 0 {
				why = fmt.Sprintf("waited %s; %s", wait, why)
			}
			return nil, nil, fmt.Errorf("no coordinator answers at %s (%w): %s", redactURL(url), err, why)
		}
		if pause == 250*time.Millisecond && notice != nil {
			fmt.Fprintf(notice, "waiting up to %s for the coordinator at %s\n", wait, redactURL(url))
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("connect %s: %w", url, err)
	}
	return nc, js, nil
}

func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("worker", "shardpool worker --server URL [--slots auto|N|CLASS=N,...] [--scratch DIR] [--name NAME]", stderr)
	server := fs.String("server", nats.DefaultURL, "coordinator `URL`")
	slots := &slotsFlag{auto: true}
	fs.Var(slots, "slots", "`SLOTS`: auto (from this host's budget and each class's peak), N (for each class), both serving every class of the active runs as they appear, or CLASS=N,... (those classes only)")
	scratch := fs.String("scratch", "", "local scratch `DIR` (default shardpool-<name>-<uid> in the policy's first scratch directory this host has, or in $TMPDIR)")
	name := fs.String("name", worker.DefaultName(), "worker `NAME` (unique per worker)")
	data := fs.String("data", worker.DefaultStateDir(), "`DIR` where this worker writes evidence (runs/<run>/)")
	grace := fs.Duration("grace", 10*time.Second, "time a child has after SIGTERM before SIGKILL")
	acc := registerAccess(fs)
	connectWait := fs.Duration("connect-wait", 2*time.Minute, "how long to wait for a coordinator that does not answer yet, or that refuses this worker's token or authority after a restart, before exiting 1 (0: fail at once)")
	idleExit := fs.Duration("idle-exit", 0, "exit (0) after this long with no shard running and none delivered, as a worker in a batch allocation should (0: serve until stopped)")
	stopAfter := fs.Int("stop-after-start-failures", 5, "stop fetching and exit 1 once `N` attempts in a row could not start their command on this host (a mount it lacks, an output it cannot write) while another worker starts commands, rather than fail the rest of the queue here; where none does (a file server away for all), hold and try again, for up to 15 minutes (0: never stop)")
	stopAlone := fs.Bool("stop-when-failing-alone", true, "stop fetching and exit 1 once attempts fail here in a row while other workers validate those very shards, more often than chance allows (false: only report it)")
	slowFS := fs.Duration("slow-fs", 2*time.Minute, "how long an attempt may wait on a file system (its commit, or the looks at its destination and output directory before its command) before this worker's report, and status, list it as waiting (a hung NFS mount)")
	verbose := fs.Bool("v", false, "debug logs")
	var sf stagingFlags
	sf.register(fs)
	if err := parseNone(fs, args); err != nil {
		return err
	}
	if *slowFS <= 0 {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("worker: --slow-fs %s: want a positive duration", *slowFS)}
	}
	if *stopAfter < 0 {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("worker: --stop-after-start-failures %d: want a number of attempts, or 0 never to stop", *stopAfter)}
	}
	*grace = graceUnderSlurm(ctx, *grace, stderr)
	// Before waiting for a coordinator: a scratch directory this worker
	// cannot use is the user's to fix now.
	if _, err := checkScratch(*scratch, *name); err != nil {
		return fmt.Errorf("worker %s: %w", *name, err)
	}
	used := acc.get()
	conn := newConnWatch(*server, used, stderr)
	nc, js, err := connect(ctx, *server, &used, "shardpool-worker-"+*name, *connectWait, stderr, conn.options()...)
	if err != nil {
		return err
	}
	defer nc.Close()
	conn.acc, conn.nc = used, nc // acc: the authority pinned from beside the token, where it was
	// A coordinator that refuses the worker after a restart stops it as
	// a signal would, with the reason.
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go conn.watch(wctx, *connectWait, stop)
	w, err := worker.New(worker.Config{JetStream: js, AdoptOrphans: true, Name: *name, Slots: slots.forClasses(nil), SlotsEach: slots.each(), Auto: slots.auto, Scratch: *scratch,
		StateDir: *data, Grace: *grace, IdleExit: *idleExit, SlowFS: *slowFS, StopAfterStartFailures: *stopAfter, StopWhenFailingAlone: *stopAlone, Staging: sf.config(""), StageFleet: sf.fleet, Logger: logger(stderr, *verbose, slog.LevelInfo),
		OnServing: func() {
			fmt.Fprintf(stdout, "worker %s serving %s from %s (shardpool %s)\n", *name, slots.describe(), *server, stream.ThisBuild().Version)
		}})
	if err != nil {
		return err
	}
	stopDrain, _ := drainOnSignal(stderr, w)
	defer stopDrain()
	ran := make(chan struct{})
	defer close(ran)
	go func() {
		select {
		case <-wctx.Done():
			defer announceDrain(stderr, w, *grace)()
			<-ran
		case <-ran:
		}
	}()
	if err := w.Run(wctx); err != nil {
		return err
	}
	fmt.Fprintln(stdout, workerStopped(*name, w, *data))
	if cause := context.Cause(wctx); ctx.Err() == nil && cause != nil {
		return exitErr{code: exitFailure, msg: fmt.Sprintf("worker %s: %v", *name, cause)}
	}
	if why := w.Failed(); why != "" {
		return exitErr{code: exitFailure, msg: fmt.Sprintf("worker %s: %s. Fix the host, then start the worker again (status names each shard's reason; --stop-after-start-failures 0 and --stop-when-failing-alone=false never stop)", *name, why)}
	}
	return nil
}

// workerStopped is a worker's last line: the shards it ended of each
// run since it started (at most five runs named), and where their
// evidence is on this host.
func workerStopped(name string, w *worker.Worker, data string) string {
	runs := w.EndedRuns()
	if len(runs) == 0 {
		return fmt.Sprintf("worker %s stopped; since it started it ended no shard", name)
	}
	const most = 5
	parts := make([]string, 0, most+1)
	for _, run := range runs[:min(len(runs), most)] {
		validated, failed := w.Ended(run)
		parts = append(parts, fmt.Sprintf("run %s %d validated, %d failed", run, validated, failed))
	}
	if len(runs) > most {
		parts = append(parts, fmt.Sprintf("and %d more run(s)", len(runs)-most))
	}
	return fmt.Sprintf("worker %s stopped; since it started: %s; evidence on this host in %s",
		name, strings.Join(parts, "; "), filepath.Join(absPath(data), "runs", "<run>"))
}

// access is what a client shows and checks: the file of the
// coordinator's token, and of its certificate authority where it serves
// TLS.
type access struct{ token, ca string }

// flags are the command-line flags that name a's files, for the commands
// written to resume.txt: never the token itself, only where it is.
func (a access) flags() string {
	out := ""
	if a.token != "" {
		out += " --token-file " + shellQuote(absPath(a.token))
	}
	if a.ca != "" {
		out += " --tls-ca " + shellQuote(absPath(a.ca))
	}
	return out
}

// accessFlags are a client's --token-file and --tls-ca.
type accessFlags struct {
	fs        *flag.FlagSet
	token, ca *string
}

// registerAccess adds --token-file and --tls-ca.
func registerAccess(fs *flag.FlagSet) *accessFlags {
	return &accessFlags{fs: fs,
		token: fs.String("token-file", os.Getenv("SHARDPOOL_TOKEN_FILE"),
			"`FILE` holding the coordinator's token: DATA/jetstream/token of 'shardpool coordinator --data DATA', DATA/stores/<run>/token of a 'shardpool run' (default $SHARDPOOL_TOKEN_FILE; a URL nats://TOKEN@HOST:PORT carries one too)"),
		ca: fs.String("tls-ca", os.Getenv("SHARDPOOL_TLS_CA"),
			"`FILE` of the certificate authority of a coordinator that serves TLS (--tls on): DATA/jetstream/ca.pem of its --data, copied with the token (default $SHARDPOOL_TLS_CA)"),
	}
}

func (f *accessFlags) get() access { return access{token: *f.token, ca: *f.ca} }

// fill takes the files of a coordinator found in a state directory for
// those not given on the command line.
func (f *accessFlags) fill(fs *flag.FlagSet, found access) {
	if !flagSet(fs, "token-file") {
		*f.token = found.token
	}
	if !flagSet(fs, "tls-ca") {
		*f.ca = found.ca
	}
}

// registerTLS adds --tls to a command that starts a coordinator.
func registerTLS(fs *flag.FlagSet) *string {
	return fs.String("tls", "auto", "serve the NATS and HTTP listeners (and a cluster's routes) over TLS: `on|off|auto`; auto is on unless they all listen on loopback only; clients pin DATA's ca.pem (beside --token-file where one is given) with --tls-ca")
}

// tlsOn decides --tls for a coordinator's listeners: the NATS one, and
// those that are optional (HTTP, a cluster's routes; "" when off).
func tlsOn(mode, listen string, optional ...string) (bool, error) {
	switch mode {
	case "on":
		return true, nil
	case "off":
		return false, nil
	case "auto", "":
		beyond := !coordinator.IsLoopback(listen)
		for _, a := range optional {
			beyond = beyond || (a != "" && !coordinator.IsLoopback(a))
		}
		return beyond, nil
	}
	return false, exitErr{code: exitUsage, msg: fmt.Sprintf("--tls %q: want on, off or auto", mode)}
}

// errNeedsTLS: the coordinator serves TLS and the client has no
// certificate authority to check it with.
var errNeedsTLS = errors.New("the coordinator serves TLS")

// isCertError reports a TLS certificate that did not verify.
func isCertError(err error) bool {
	var ua x509.UnknownAuthorityError
	var cv *tls.CertificateVerificationError
	return errors.As(err, &ua) || errors.As(err, &cv) || strings.Contains(err.Error(), "x509:") ||
		strings.Contains(err.Error(), "not issued by the authority")
}

// isCertTimeError reports a coordinator certificate of the pinned
// authority refused for this host's time (coordinator.ErrCertTime, which
// nats.go passes on as text).
func isCertTimeError(err error) bool {
	return errors.Is(err, coordinator.ErrCertTime) || strings.Contains(err.Error(), coordinator.ErrCertTime.Error())
}

// isAuthError reports a server's refusal of a connection's credentials.
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// redactURL is url without its user information (a token, or a user and
// password): for messages and for commands written to the evidence.
func redactURL(raw string) string {
	var out []string
	for _, one := range strings.Split(raw, ",") {
		if u, err := neturl.Parse(one); err == nil && u.User != nil {
			u.User = nil
			one = u.String()
		}
		out = append(out, one)
	}
	return strings.Join(out, ",")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// urlHost is the host:port of a nats:// or tls:// URL.
func urlHost(raw string) string {
	if u, err := neturl.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return raw
}

// absPath is p made absolute, or p where that fails.
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// checkScratch checks the scratch directory a worker named name will use,
// the one given or its default (worker.CheckScratch), and returns it.
func checkScratch(scratch, name string) (string, error) {
	if scratch != "" {
		return scratch, worker.CheckScratch(scratch, false)
	}
	if !stream.ValidWorkerName(name) {
		return "", exitErr{code: exitUsage, msg: fmt.Sprintf("--name %q must match [A-Za-z0-9_-]{1,64}", name)}
	}
	dir, err := worker.PolicyScratch("", name)
	if err != nil {
		return "", err
	}
	return dir, worker.CheckScratch(dir, true)
}
