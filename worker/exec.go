package worker

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/stream"
)

// result is how one child process ended.
type result struct {
	outcome    string
	reason     string
	exitCode   *int
	signal     string
	peakRSS    int64
	peakMemory int64
	duration   time.Duration
	cpuSeconds float64
	readBytes  int64
	writeBytes int64
	// logged: the command wrote output, so its log file exists; log is
	// its path (the one asked for, or a free name beside it: createLog).
	logged bool
	log    string
	// logLost: the command wrote output, but its log could not be made.
	logLost string
	// left says what the command left running outside its process group
	// that was killed when it ended (leftRunning), or is "".
	left string
	// halted: the attempt was interrupted by its run's halt with the
	// running commands stopped (halts.go).
	halted bool
}

// leftRunning describes the processes killed because a command left them
// running when it ended: at most the first five are named.
func leftRunning(procs []string) string {
	named := procs
	if len(named) > 5 {
		named = named[:5]
	}
	s := fmt.Sprintf("killed %d process(es) the command left running outside its process group when it ended: %s", len(procs), strings.Join(named, ", "))
	if len(procs) > len(named) {
		s += fmt.Sprintf(" and %d more", len(procs)-len(named))
	}
	return s
}

// stopCause says why the worker ended a child early.
type stopCause int

const (
	stopNone stopCause = iota
	stopTimeout
	stopShutdown
	stopLeaseLost
	// stopDrain: the command died of a signal this worker did not send
	// while it drains (Drain: Slurm's --signal reaches every process of
	// the job, the commands too).
	stopDrain
)

// enterScript writes the shell's pid to each file before "--", then execs
// the rest.
const enterScript = `while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"`

// threadVars are set to the class's CPU count so that N shards of a
// threaded library do not each start one thread per core.
var threadVars = []string{"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
	"VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS", "RAYON_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"}

// childEnv is the environment of a shard's command: the worker's own, the
// spec's env (its placeholders expanded), thread limits, and SHARDPOOL_*
// variables.
func childEnv(bin string, base map[string]string, spec *stream.Spec, class stream.Class, m *stream.ShardMsg, v stream.Vars) ([]string, error) {
	return shardEnv(classEnv(bin, base, spec, class), spec, m, v)
}

// classEnv is the part of a child's environment that is the same for every
// shard of one run generation and class (sorted KEY=value): the worker's
// own, the thread variables, the GPU mask, the spec's env, SHARDPOOL_BIN.
// A worker keeps it per fingerprint and class (see Worker.classEnv).
func classEnv(bin string, base map[string]string, spec *stream.Spec, class stream.Class) []string {
	env := make(map[string]string, len(base)+len(threadVars)+len(spec.Env)+2)
	for k, val := range base {
		env[k] = val
	}
	for _, k := range threadVars {
		env[k] = fmt.Sprint(class.CPUs)
	}
	if class.GPUs == 0 {
		// A class that asked for no GPU gets none, so it cannot take memory on
		// a GPU that admission did not account for.
		env["CUDA_VISIBLE_DEVICES"] = ""
	}
	for k, val := range spec.Env {
		env[k] = val
	}
	if bin != "" {
		env["SHARDPOOL_BIN"] = bin
	}
	out := make([]string, 0, len(env))
	for k, val := range env {
		out = append(out, k+"="+val)
	}
	sort.Strings(out)
	return out
}

// shardEnv adds one attempt's variables to a class environment; they
// replace entries of the same name. So do the values of the spec's env
// that name placeholders ({out}, {scratch} ...), expanded for the attempt,
// except where they would replace a variable of shardpool's own.
func shardEnv(cls []string, spec *stream.Spec, m *stream.ShardMsg, v stream.Vars) ([]string, error) {
	own := make([]string, 0, 7+len(m.Params))
	own = append(own, "SHARDPOOL_RUN="+m.Run, "SHARDPOOL_SHARD_ID="+m.ID, "SHARDPOOL_FINGERPRINT="+m.Fingerprint,
		"SHARDPOOL_ATTEMPT="+strconv.Itoa(v.Attempt), "SHARDPOOL_OUT="+v.Out, "SHARDPOOL_CKPT_DIR="+v.Ckpt, "SHARDPOOL_SCRATCH="+v.Scratch)
	params := make([]string, 0, len(m.Params))
	for k, val := range m.Params {
		params = append(params, stream.ParamEnv(k)+"="+val)
	}
	sort.Strings(params)
	own = append(own, params...)
	expanded, err := stream.ExpandEnv(spec.Env, v)
	if err != nil {
		return nil, err
	}
	for _, kv := range expanded {
		if !replaced(kv, own) {
			own = append(own, kv)
		}
	}
	out := make([]string, 0, len(cls)+len(own))
	for _, kv := range cls {
		if (strings.HasPrefix(kv, "SHARDPOOL_") || len(expanded) > 0) && replaced(kv, own) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, own...), nil
}

// replaced reports whether one of own sets kv's variable.
func replaced(kv string, own []string) bool {
	k, _, _ := strings.Cut(kv, "=")
	for _, o := range own {
		if len(o) > len(k) && o[len(k)] == '=' && o[:len(k)] == k {
			return true
		}
	}
	return false
}

// selfPath is the running shardpool binary, so that jobs can call
// "$SHARDPOOL_BIN ckpt commit" without it being on PATH; "" when this
// process is a test binary (go test names them *.test), where
// Config.Binary is used. A binary installed under another name
// (shardpool-1.4, sp) is still shardpool: requiring the name left
// SHARDPOOL_BIN unset for it, and a job that called "$SHARDPOOL_BIN ckpt"
// ran whatever "shardpool" PATH held, or failed.
func selfPath() string {
	p, err := os.Executable()
	if err != nil || strings.HasSuffix(filepath.Base(p), ".test") {
		return ""
	}
	return p
}

// environ is the worker's own environment as a map.
func environ() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, val, ok := strings.Cut(kv, "="); ok {
			env[k] = val
		}
	}
	return env
}

// dirProblem says why a command could not start in dir, when dir is the
// cause: exec reports a working directory that is missing or cannot be
// entered as the program's own error ("fork/exec /usr/bin/sh: no such
// file or directory"), which sends a user looking for the program. It is
// "" when dir is a directory this process may enter.
func (w *Worker) dirProblem(dir string) string {
	if dir == "" {
		return ""
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("the run's directory %s, where the command runs, does not exist on host %s (a file system not mounted there, or the spec's directory moved since it was submitted)", dir, w.host)
	case err != nil:
		return fmt.Sprintf("the run's directory %s, where the command runs, cannot be read on host %s: %v", dir, w.host, err)
	case !fi.IsDir():
		return fmt.Sprintf("the run's directory %s, where the command runs, is not a directory on host %s", dir, w.host)
	case unix.Access(dir, unix.X_OK) != nil:
		return fmt.Sprintf("the run's directory %s, where the command runs, cannot be entered by uid %d on host %s (permission denied)", dir, os.Getuid(), w.host)
	}
	return ""
}

// execute runs argv in its own process group with output to logPath. It
// returns when the child has exited; on timeout, shutdown (stop), preemption
// (preempt) or a lost lease the group gets SIGTERM, then SIGKILL after the
// grace period. A nil channel never fires.
// onStart, when set, is called with the child's process group as soon as
// it runs (admission's registry, the profiler's sampler, a shard cgroup);
// the function it returns is called when the child has exited.
//
// cg, when set, is the shard's cgroup, which the child is in before it
// runs the command, so nothing it forks can escape it. On cgroup v1 the
// child starts there (startIn); on cgroup v2 it is cloned into it
// (startInto), or, where the kernel cannot, a small /bin/sh prologue
// writes its own pid into cgroup.procs, then execs argv.
//
// held names the shard message the command runs for, if any; the child
// journal keeps it beside the process group (see heldShard).
func (w *Worker) execute(argv, env []string, dir, logPath string, timeout time.Duration, stop, preempt, leaseLost <-chan struct{}, onStart func(pgid int) func(), cg *shardCgroup, held *heldShard) result {
	out, err := newLazyLog(logPath)
	if err != nil {
		return result{outcome: stream.OutcomeStart, reason: fmt.Sprintf("open log: %v", err)}
	}
	command := func(argv []string) *exec.Cmd {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, out.w, out.w // stdin: /dev/null (startCmd)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	cmd := command(argv)
	oomBefore := w.oomBaseline()
	start := time.Now()
	var ident uint64
	if w.adopter != nil {
		ident = attemptIdentity(env)
	}
	err = w.adopter.start(ident, func() (int, error) {
		var err error
		switch {
		case cg == nil:
			err = startCmd(cmd)
		case !cg.v2:
			err = cg.startIn(cmd)
		default:
			if err = cg.startInto(cmd); errors.Is(err, errNoCloneInto) {
				if err != errNoCloneInto { // the first time
					w.log.Info("cgroup v2: children enter their cgroup through a /bin/sh prologue", "why", err)
				}
				argv = cg.prologue(argv)
				cmd = command(argv)
				err = startCmd(cmd)
			}
		}
		if err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil {
		reason, detail := fmt.Sprintf("start %s: %v", argv[0], err), err.Error()
		if why := w.dirProblem(dir); why != "" {
			reason, detail = why, why
		} else if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOEXEC) {
			if why := startProblem(argv[0], dir, env); why != "" {
				reason, detail = fmt.Sprintf("start %s: %s", argv[0], why), why
			}
		}
		out.abort()
		out.note(fmt.Sprintf("shardpool: cannot start %q: %s\n", argv[0], detail))
		return result{outcome: stream.OutcomeStart, reason: reason, logged: true, log: out.path}
	}
	out.started()
	w.lastStarted.Store(time.Now().UnixNano())
	pgid := cmd.Process.Pid
	w.journal.started(pgid, held)
	if onStart != nil {
		if end := onStart(pgid); end != nil {
			defer end()
		}
	}
	done := make(chan error, 1)
	go func() { done <- waitCmd(cmd) }()

	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	cause := stopNone
	var kill <-chan time.Time
	hurry := w.hurry
	var waitErr error
	terminate := func(c stopCause) {
		if cause != stopNone {
			return
		}
		cause = c
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		kt := time.NewTimer(w.cfg.Grace)
		kill = kt.C
	}
wait:
	for {
		select {
		case waitErr = <-done:
			w.adopter.waited(pgid)
			break wait
		case <-tc:
			terminate(stopTimeout)
		case <-stop:
			stop = nil
			terminate(stopShutdown)
		case <-preempt:
			preempt = nil
			terminate(stopShutdown)
		case <-leaseLost:
			leaseLost = nil
			terminate(stopLeaseLost)
		case <-kill:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			kill = nil
		case <-hurry:
			hurry = nil
			terminate(stopShutdown)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			kill = nil
		}
	}
	if cause == stopNone && stopSignalled(cmd.ProcessState) && stop != nil {
		// A command stopped by a signal this worker did not send: when
		// the same signal stops or drains the worker (Slurm's scancel,
		// preemption, time limit and --signal reach every process of the
		// job at once, and systemd every process of the unit's cgroup),
		// the worker learns of it a moment after its children may have
		// died of it. Such a death is the worker's shutdown or drain, not
		// the shard's failure.
		t := time.NewTimer(stopSignalWait)
		select {
		case <-stop:
			cause = stopShutdown
		case <-w.drain:
			cause = stopDrain
		case <-t.C:
		}
		t.Stop()
	}
	// Whatever the child left behind in its group goes with it, and so
	// does what left the group: found in the shard's cgroup, or among the
	// worker's adopted children (adopt.go). Before the log is closed: such
	// a process often holds the output pipe.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	r := result{duration: time.Since(start)}
	if left := append(cg.killLeft(), w.adopter.end(ident, pgid)...); len(left) > 0 {
		r.left = leftRunning(left)
		out.trailer("shardpool: " + r.left)
	}
	w.journal.ended(pgid)
	r.logged = out.close()
	if r.logged {
		r.log = out.path
	} else if out.err != nil {
		r.logLost = out.err.Error()
	}
	ps := cmd.ProcessState
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru != nil {
		// wait4's usage covers the child and the descendants it waited for.
		r.peakRSS = ru.Maxrss * 1024
		if r.peakRSS <= selfPeakRSS() {
			// Linux counts the peak RSS of the process a child exec'd from
			// (this one: Go forks with the parent's memory shared) into the
			// child's, so a figure up to this process's own peak may be
			// ours, not the command's: unknown, not ours.
			r.peakRSS = 0
		}
		r.cpuSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		r.readBytes, r.writeBytes = ru.Inblock*512, ru.Oublock*512
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	switch {
	case cause == stopTimeout:
		r.outcome, r.reason = stream.OutcomeTimeout, fmt.Sprintf("exceeded the time limit of %s", timeout)
	case cause == stopShutdown:
		r.outcome, r.reason = stream.OutcomeInterrupted, "worker shutting down"
	case cause == stopDrain:
		r.outcome, r.reason = stream.OutcomeInterrupted, fmt.Sprintf("%s while the worker drains (%s): the job's end, not the shard's failure", signalled(ws), w.drainReason())
	case cause == stopLeaseLost:
		r.outcome, r.reason = stream.OutcomeLeaseLost, "lease could not be renewed; stopped without commit"
	case ws.Signaled():
		r.signal = ws.Signal().String()
		r.outcome, r.reason = stream.OutcomeSignal, "killed by signal "+r.signal
		if ws.Signal() == syscall.SIGKILL {
			if after := oomKills(w.cfg.ProcRoot); oomBefore >= 0 && after > oomBefore {
				r.outcome, r.reason = stream.OutcomeOOM, "killed by the OOM killer (SIGKILL while the host's oom_kill count rose)"
			}
		}
	case waitErr == nil:
		code := 0
		r.exitCode, r.outcome = &code, stream.OutcomeOK
	default:
		code := ps.ExitCode()
		r.exitCode, r.outcome, r.reason = &code, stream.OutcomeExit, fmt.Sprintf("exit status %d", code)
		// A shell reports a child killed by SIGKILL as 128+9.
		if after := oomKills(w.cfg.ProcRoot); code == 128+int(syscall.SIGKILL) && oomBefore >= 0 && after > oomBefore {
			r.outcome, r.reason = stream.OutcomeOOM, "a process of the shard was killed by the OOM killer (exit 137 while the host's oom_kill count rose)"
		}
	}
	if ws.Signaled() && cause != stopNone {
		r.signal = ws.Signal().String()
	}
	// A failed command's last words usually say why (a traceback's last
	// line, "No such file or directory"): the reason quotes them, so that
	// status and a BLOCKED run's summary show them without the log.
	switch r.outcome {
	case stream.OutcomeExit, stream.OutcomeSignal, stream.OutcomeOOM, stream.OutcomeTimeout:
		if line := out.lastLine(); line != "" {
			r.reason += "; last output: " + strconv.Quote(line)
		}
	}
	return r
}

// stopSignalWait is how long a command's death by a stop signal waits for
// the worker's own shutdown before it is judged the shard's failure.
const stopSignalWait = 2 * time.Second

// stopSignals stop or drain a worker (cmd/shardpool): a command that dies
// of one the worker did not send may have died of the same signal.
var stopSignals = []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1}

// stopSignalled reports whether a command ended by one of stopSignals, or
// as a shell reports a child that did (exit 128+n).
func stopSignalled(ps *os.ProcessState) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return false
	}
	for _, sig := range stopSignals {
		if (ws.Signaled() && ws.Signal() == sig) || (ws.Exited() && ws.ExitStatus() == 128+int(sig)) {
			return true
		}
	}
	return false
}

// signalled says how a command ended: "killed by signal S" or "exit
// status N".
func signalled(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "killed by signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// devNull is /dev/null, opened once for every command's standard stream
// that startCmd finds unset, rather than once per command.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) })

// startCmd starts cmd as cmd.Start would, with os.StartProcess: Start
// copies the environment and checks the copy for duplicates, 2-3% of a
// short shard's CPU (forty-fourth session), and childEnv builds it
// without any. cmd's Stdin, Stdout and Stderr must be files or nil
// (/dev/null); wait for it with waitCmd, not cmd.Wait.
func startCmd(cmd *exec.Cmd) error {
	if cmd.Err != nil {
		return cmd.Err
	}
	if cmd.Process != nil {
		return errors.New("exec: already started")
	}
	files := make([]*os.File, 3)
	for i, s := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		switch f := s.(type) {
		case *os.File:
			files[i] = f
		case nil:
			null, err := devNull()
			if err != nil {
				return err
			}
			files[i] = null
		default:
			return fmt.Errorf("exec %s: standard stream %d is a %T, not a file", cmd.Path, i, s)
		}
	}
	p, err := os.StartProcess(cmd.Path, cmd.Args, &os.ProcAttr{Dir: cmd.Dir, Env: cmd.Env, Files: files, Sys: cmd.SysProcAttr})
	if err != nil {
		return err
	}
	cmd.Process = p
	return nil
}

// waitCmd waits for a command that startCmd started, as cmd.Wait would:
// it sets cmd.ProcessState and returns an *exec.ExitError for a command
// that did not exit 0.
func waitCmd(cmd *exec.Cmd) error {
	state, err := cmd.Process.Wait()
	cmd.ProcessState = state
	if err == nil && !state.Success() {
		err = &exec.ExitError{ProcessState: state}
	}
	return err
}

// lazyLog is a child's stdout and stderr: one pipe, copied into the log
// file, which is created on the first byte. A shard that prints nothing
// leaves no file (creating one per attempt was a measurable part of a
// short shard's cost); a crash of the worker loses at most what sits in
// the pipe, and the child is killed with it (Pdeathsig).
//
// A log keeps at most the first logHead bytes and the last logTail bytes
// of the output, with a line saying how much was left out between them:
// a job that floods stdout must not fill the state directory's disk.
type lazyLog struct {
	path string
	r, w *os.File
	done chan struct{}
	f    *os.File

	head, tail int64  // limits (logHead, logTail; lowered by tests)
	written    int64  // bytes in the file
	ring       []byte // the last bytes past head, once there are any
	ringPos    int64  // total bytes that went to the ring

	// The output's last bytes, for the attempt's reason (lastLine).
	last      [lastOutput]byte
	lastN     int
	lastTotal int64 // bytes of output in all

	notes []string // shardpool's own lines, written after the output
	// err is why the log file could not be made; the output went to the
	// last bytes (lastLine) only. Read after close.
	err error
}

// lastOutput is how much of a child's output's end a log keeps in memory
// for the attempt's reason.
const lastOutput = 256

// Limits of one attempt log.
const (
	logHead = 64 << 20
	logTail = 1 << 20
)

func newLazyLog(path string) (*lazyLog, error) {
	r, w, err := logPipe()
	if err != nil {
		return nil, err
	}
	return &lazyLog{path: path, r: r, w: w, done: make(chan struct{}), head: logHead, tail: logTail}, nil
}

// logPipe is os.Pipe whose write end, the child's, never meets Go's
// poller: os.Pipe registers both ends, and the start of the child then
// sets the write end back to blocking, six system calls per attempt that
// do nothing.
func logPipe() (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	// A non-blocking descriptor is read through the poller.
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

// started closes the parent's copy of the write end and starts copying.
func (l *lazyLog) started() {
	l.w.Close()
	go l.copy()
}

// copyBufs are the buffers of the copies that have output to copy. Most
// short shards print nothing: their copy reads the end of the output into
// a few bytes of its own and never takes one.
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (l *lazyLog) copy() {
	defer close(l.done)
	var first [512]byte
	buf := first[:]
	opened := false
	for {
		n, err := l.r.Read(buf)
		if n > 0 && !opened {
			opened = true
			// On error the copy goes on draining, so the child never
			// blocks on a full pipe; its output is lost.
			l.f, l.path, l.err = createLog(l.path)
		}
		if n > 0 {
			l.remember(buf[:n])
			if l.f != nil {
				l.keep(buf[:n])
			}
		}
		if err != nil {
			return
		}
		if n > 0 && len(buf) == len(first) {
			big := copyBufs.Get().(*[32 << 10]byte)
			defer copyBufs.Put(big)
			buf = big[:]
		}
	}
}

// remember keeps the last lastOutput bytes of the output.
func (l *lazyLog) remember(b []byte) {
	l.lastTotal += int64(len(b))
	if len(b) >= len(l.last) {
		l.lastN = copy(l.last[:], b[len(b)-len(l.last):])
		return
	}
	kept := min(l.lastN, len(l.last)-len(b))
	copy(l.last[:kept], l.last[l.lastN-kept:l.lastN])
	l.lastN = kept + copy(l.last[kept:], b)
}

// lastLine is the output's last line that is not blank, at most
// maxReasonLine bytes of its end, with control characters and invalid
// UTF-8 replaced; "…" marks a line cut at its start. It is read after
// close.
func (l *lazyLog) lastLine() string {
	b := bytes.TrimRight(l.last[:l.lastN], " \t\r\n")
	// The window may have begun within the line, unless it holds all the
	// output or a line break.
	cut := l.lastTotal > int64(l.lastN)
	if i := bytes.LastIndexAny(b, "\r\n"); i >= 0 {
		// After a carriage return (a progress bar) what shows is the rest.
		b, cut = b[i+1:], false
	}
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(b), "\uFFFD"))
	s = strings.TrimSpace(s)
	if len(s) > maxReasonLine {
		s, cut = s[len(s)-maxReasonLine:], true
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	if cut && s != "" {
		s = "…" + s
	}
	return s
}

// maxReasonLine bounds the output line an attempt's reason quotes.
const maxReasonLine = 200

// keep writes b while the file is under head and keeps the rest in the
// tail ring.
func (l *lazyLog) keep(b []byte) {
	if room := l.head - l.written; room > 0 {
		k := min(int64(len(b)), room)
		n, _ := l.f.Write(b[:k])
		l.written += int64(n)
		b = b[k:]
	}
	if len(b) == 0 || l.tail <= 0 {
		l.ringPos += int64(len(b))
		return
	}
	if l.ring == nil {
		l.ring = make([]byte, l.tail)
	}
	for len(b) > 0 {
		at := l.ringPos % l.tail
		c := copy(l.ring[at:], b)
		b = b[c:]
		l.ringPos += int64(c)
	}
}

// finish writes what the ring kept after a line that says how much output
// was left out.
func (l *lazyLog) finish() {
	if l.ringPos == 0 {
		return
	}
	kept := min(l.ringPos, l.tail)
	fmt.Fprintf(l.f, "\n[shardpool: the output went on past this log's first %s; %d bytes left out; its last %d bytes follow]\n",
		stream.FormatSize(l.head), l.ringPos-kept, kept)
	if kept < l.tail {
		l.f.Write(l.ring[:kept])
		return
	}
	at := l.ringPos % l.tail
	l.f.Write(l.ring[at:])
	l.f.Write(l.ring[:at])
}

// logDrain bounds the wait for the log's last bytes after the child's
// process group is gone: a descendant that left the group may hold the
// pipe open indefinitely.
const logDrain = 2 * time.Second

// close waits for the copy to reach the end of the output (or logDrain),
// closes everything, and reports whether a log file was written.
func (l *lazyLog) close() bool {
	select {
	case <-l.done:
	default:
		t := time.NewTimer(logDrain)
		select {
		case <-l.done:
		case <-t.C:
			l.r.Close() // the copy returns with an error
			<-l.done
		}
		t.Stop()
	}
	l.r.Close()
	if l.f == nil && len(l.notes) > 0 && l.err == nil {
		l.f, l.path, l.err = createLog(l.path)
	}
	if l.f == nil {
		return false
	}
	l.finish()
	for _, n := range l.notes {
		if l.written > 0 {
			l.f.WriteString("\n")
		}
		fmt.Fprintf(l.f, "[%s]\n", n)
	}
	l.f.Close()
	return true
}

// trailer adds a line of shardpool's own after the output; the log is
// then written even when the command printed nothing. Before close.
func (l *lazyLog) trailer(msg string) {
	l.notes = append(l.notes, msg)
}

// abort closes both ends when the child never started.
func (l *lazyLog) abort() {
	l.r.Close()
	l.w.Close()
}

// note writes a message of shardpool's own as the log of a child that
// never started (creating it).
func (l *lazyLog) note(msg string) {
	f, path, err := createLog(l.path)
	if err != nil {
		return
	}
	l.path = path
	f.WriteString(msg)
	f.Close()
}

// createLog creates a new log file at path, or, when that name is taken,
// at a free one beside it (a.1.log, a.1-2.log, a.1-3.log...): a log never
// replaces another. A new generation's deliveries count from 1 again, and
// so do a shard's when its message is published again (a lost one): their
// logs took the names of the earlier attempts', and replaced them.
func createLog(path string) (*os.File, string, error) {
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext)
	for k := 1; ; k++ {
		p := path
		if k > 1 {
			p = fmt.Sprintf("%s-%d%s", base, k, ext)
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil || !errors.Is(err, fs.ErrExist) || k == 1000 {
			return f, p, err
		}
	}
}

// selfPeakRSS is this process's own peak RSS: what the kernel adds to the
// peak RSS of each child it starts (see execute).
func selfPeakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return math.MaxInt64 // unknown: no child's figure can be told from ours
	}
	return ru.Maxrss * 1024
}
