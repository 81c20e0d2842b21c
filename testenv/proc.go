package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary builds cmd/shardpool once per test process and returns its path:
// shardpool-testbin-<uid>/p<pid>/shardpool in the temp directory, the
// process's own. (One fixed path per user was shared by every test
// process: a suite run in a clean clone then ran a binary another
// checkout's tests had just built, of other code.) Directories of test
// processes that are gone are removed here, so runs do not leave copies
// behind for long.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		base := filepath.Join(os.TempDir(), fmt.Sprintf("shardpool-testbin-%d", os.Getuid()))
		removeGoneBinaries(base)
		dir := filepath.Join(base, fmt.Sprintf("p%d", os.Getpid()))
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		buildPath = filepath.Join(dir, "shardpool")
		args := []string{"build", "-o", buildPath}
		// Stamp the commit (`shardpool version`) where git can read the
		// checkout, whatever GOFLAGS says; -buildvcs=auto fails the build
		// where it cannot (a checkout of another user's).
		git := exec.Command("git", "rev-parse", "--git-dir")
		git.Dir = root
		if git.Run() == nil {
			args = append(args, "-buildvcs=auto")
		}
		cmd := exec.Command("go", append(args, "./cmd/shardpool")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build shardpool: %v", buildErr)
	}
	return buildPath
}

// removeGoneBinaries removes the binaries of test processes that no
// longer run (base/p<pid>), and what the fixed path of earlier versions
// left (base/shardpool, base/.build-*) once it is an hour old.
func removeGoneBinaries(base string) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if pid, err := strconv.Atoi(strings.TrimPrefix(name, "p")); err == nil && strings.HasPrefix(name, "p") {
			if syscall.Kill(pid, 0) == syscall.ESRCH {
				os.RemoveAll(filepath.Join(base, name))
			}
			continue
		}
		if info, err := e.Info(); err == nil && (name == "shardpool" || strings.HasPrefix(name, ".build-")) && time.Since(info.ModTime()) > time.Hour {
			os.Remove(filepath.Join(base, name))
		}
	}
}

// Proc is a shardpool process started by a test.
type Proc struct {
	Cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
	err  error
}

// SyncBuffer is a bytes.Buffer that goroutines may write at once: a
// process's output, or a log handler's destination in a test.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Start runs the shardpool binary with args; the process is killed at cleanup.
func Start(t testing.TB, args ...string) *Proc {
	t.Helper()
	return StartCmd(t, Binary(t), args...)
}

// StartCmd runs any program like Start does.
func StartCmd(t testing.TB, name string, args ...string) *Proc {
	t.Helper()
	return StartCmdEnv(t, nil, name, args...)
}

// StartEnv is Start with env (NAME=VALUE) added to the environment, after
// this process's: a later entry of a name wins (a worker given a PATH of
// its own, as on a host that lacks a program).
func StartEnv(t testing.TB, env []string, args ...string) *Proc {
	t.Helper()
	return StartCmdEnv(t, env, Binary(t), args...)
}

// StartOnHost is StartEnv with the binary in a UTS namespace of its own
// whose host name is host (root only): a host of its own for what tells
// hosts apart by name, such as the policy file's host tiers. A shell in
// the namespace sets the name and execs the binary, its path and
// arguments passed as positional parameters, never interpolated.
func StartOnHost(t testing.TB, host string, env []string, args ...string) *Proc {
	t.Helper()
	RequireRoot(t)
	argv := append([]string{"-c", `printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"`, host, Binary(t)}, args...)
	return startCmd(t, env, &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWUTS}, "/bin/sh", argv...)
}

// StartCmdEnv is StartCmd with env added to the environment.
func StartCmdEnv(t testing.TB, env []string, name string, args ...string) *Proc {
	t.Helper()
	return startCmd(t, env, &syscall.SysProcAttr{Setpgid: true}, name, args...)
}

func startCmd(t testing.TB, env []string, attr *syscall.SysProcAttr, name string, args ...string) *Proc {
	t.Helper()
	defaultStopSignals()
	cmd := exec.Command(name, args...)
	// The processes of one test share a host ledger, as on a real host;
	// those of tests running at the same time (other packages) do not.
	cmd.Env = append(append(os.Environ(), "SHARDPOOL_HOST_LEDGER="+LedgerDir(t)), env...)
	p := &Proc{Cmd: cmd, out: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start shardpool %v: %v", args, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Signal(syscall.SIGKILL)
		<-p.done
	})
	return p
}

// defaultStopSignals makes the processes that tests start begin with SIGHUP
// and SIGINT at their defaults, as from a terminal, also where the tests
// themselves run with them ignored (`nohup make test`, or a background
// job of a script), which children would inherit: shardpool leaves a
// signal it started with ignored alone, as nohup means, and a test that
// stops a worker with SIGHUP would wait for it in vain. A signal caught
// here is reset to its default in a child at exec; in this process it is
// caught and dropped, as it was ignored. Tests of nohup start it
// themselves (TestNohupRunIgnoresHangup).
var defaultStopSignals = sync.OnceFunc(func() {
	for _, s := range []os.Signal{syscall.SIGHUP, os.Interrupt} {
		if signal.Ignored(s) {
			signal.Notify(make(chan os.Signal, 1), s)
		}
	}
})

var ledgers sync.Map // testing.TB -> host ledger directory

// LedgerDir is t's host ledger directory: workers started for t, in
// process or as shardpool processes, share the budget through it.
func LedgerDir(t testing.TB) string {
	if d, ok := ledgers.Load(t); ok {
		return d.(string)
	}
	d, _ := ledgers.LoadOrStore(t, t.TempDir())
	t.Cleanup(func() { ledgers.Delete(t) })
	return d.(string)
}

// Output is everything the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Signal sends sig to the process's whole group (it and its children).
func (p *Proc) Signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.Cmd.Process.Pid, sig)
}

// SignalMain sends sig to the shardpool process only.
func (p *Proc) SignalMain(sig syscall.Signal) { _ = p.Cmd.Process.Signal(sig) }

// Wait waits for exit up to timeout and returns the exit code (-1 if killed
// by a signal); it fails t on timeout.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("shardpool %v still running after %s; output:\n%s", p.Cmd.Args[1:], timeout, p.Output())
	}
	return p.Cmd.ProcessState.ExitCode()
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// FreePort returns a loopback host:port that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct loopback host:ports that were free a moment
// ago (coordinator.LoopbackPorts).
func FreePorts(t testing.TB, n int) []string {
	t.Helper()
	ports, err := coordinator.LoopbackPorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}
