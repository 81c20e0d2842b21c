package drill

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/drill/powercut"
	"github.com/shardpool/shardpool/stream"
)

const (
	powerCutName   = "recovery after a power cut"
	powerCutRun    = "powercut"
	powerCutShards = 40
	powerCuts      = 2
)

// powerCut checks recovery from a host losing power, which a drill cannot
// observe for real from inside one boot: where powercut can simulate one
// (root, loop devices), a small job runs under `shardpool run` with its
// state on one such file system and its inputs and outputs on another; the
// power goes at random moments, the run is resumed each time with its
// resume command, and it must end COMPLETE with every output verifying
// and each shard recorded validated exactly once. The file systems are
// XFS where the drill's state directory is on XFS (and mkfs.xfs is
// there), else ext4. It checks shardpool's order of writes and syncs, not
// the honesty of this host's disks about their caches.
func (d *drill) powerCut(ctx context.Context) {
	if err := powercut.Available(); err != nil {
		d.check(powerCutName, Unverified, "not simulated here: "+err.Error()+"; a drill cannot observe a real reboot from inside one boot")
		return
	}
	kind, why := simulatedKind(d.dir)
	d.say("simulating power cuts under a %d-shard run (%s on loop devices)", powerCutShards, kind)
	detail, err := d.cutPower(ctx, kind, why)
	var sim simulationError
	switch {
	case errors.As(err, &sim):
		// The host would not let the drill simulate (a container that
		// may not mount, say): that proves nothing either way.
		d.check(powerCutName, Unverified, "the simulation failed: "+sim.Error())
	case err != nil:
		d.check(powerCutName, Fail, err.Error())
	default:
		d.check(powerCutName, Pass, detail)
	}
}

// simulationError is a failure of the power-cut simulation itself (making,
// mounting or cutting its file systems), not of shardpool.
type simulationError struct{ error }

func simulation(err error) error {
	if err == nil {
		return nil
	}
	return simulationError{err}
}

// simulatedKind is the file system the power cuts are simulated under:
// XFS where the drill's own state directory is on XFS and mkfs.xfs is
// there, else ext4; why says which, for the check's detail.
func simulatedKind(dir string) (kind, why string) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.XFS_SUPER_MAGIC {
		return powercut.Ext4, "ext4 with its journal"
	}
	if err := powercut.AvailableKind(powercut.XFS); err != nil {
		return powercut.Ext4, "ext4 with its journal, not XFS as under this state directory: " + err.Error()
	}
	return powercut.XFS, "XFS, as under this state directory"
}

func (d *drill) cutPower(ctx context.Context, kind, why string) (string, error) {
	base := filepath.Join(d.dir, "powercut")
	state, err := powercut.NewKind(filepath.Join(base, "state"), 256<<20, kind)
	if err != nil {
		return "", simulation(err)
	}
	defer removeImages(state, filepath.Join(base, "state"))
	disk, err := powercut.NewKind(filepath.Join(base, "disk"), 64<<20, kind)
	if err != nil {
		return "", simulation(err)
	}
	defer removeImages(disk, filepath.Join(base, "disk"))
	spec, err := copyJob(filepath.Join(disk.Dir, "job"), powerCutRun, powerCutShards, "0.2", 2)
	if err != nil {
		return "", err
	}
	syscall.Sync() // the job's files are on disk before the first cut
	data := filepath.Join(state.Dir, "data")
	// -v: the log has the time of each step and what nats-server found
	// as it recovered the store after each cut, for a resume that fails.
	args := []string{"run", "--quiet", "-v", "--data", data, "--scratch", filepath.Join(state.Dir, "scratch"), "--slots", "4", "--lease-ttl", "3s", spec}
	log := d.logFile("powercut")
	if log != nil {
		defer log.Close()
	}
	cuts := 0
	for range powerCuts {
		r, err := d.startRun(args, log)
		if err != nil {
			return "", err
		}
		select {
		case <-time.After(time.Duration(150+mrand.IntN(600)) * time.Millisecond):
		case <-r.done:
			// Done before the cut (a fast host): the cuts so far are
			// the check, if there were any.
			if cuts == 0 {
				return "", fmt.Errorf("the run ended before the first power cut (see %s)", filepath.Join(d.dir, "powercut.log"))
			}
			continue
		}
		r.kill()
		if err := state.Cut(); err != nil {
			return "", simulation(err)
		}
		if err := disk.Cut(); err != nil {
			return "", simulation(err)
		}
		cuts++
		d.say("power cut %d: resuming the run", cuts)
	}
	if err := d.resumeAfterCuts(ctx, args, data, log); err != nil {
		return "", fmt.Errorf("the run resumed after %d power cuts did not complete: %v (see %s)", cuts, err, filepath.Join(d.dir, "powercut.log"))
	}
	bad, err := checkAfterPowerCuts(ctx, data, filepath.Join(filepath.Dir(spec), "out"))
	if err != nil {
		return "", err
	}
	if len(bad) > 0 {
		return "", fmt.Errorf("after %d power cuts: %s", cuts, strings.Join(bad, "; "))
	}
	return fmt.Sprintf("%d cuts at random moments of a %d-shard run, resumed each time: COMPLETE, every output verifies, each shard validated once with every attempt closed "+
		"(simulated: %s on loop devices, state and outputs on two file systems; checks shardpool's order of writes and syncs, not this host's disks)",
		cuts, powerCutShards, why), nil
}

// resumeAfterCuts runs the resume command to its end, for at most
// resumeLimit. One that has not ended by then is asked first where it
// stands (`shardpool status --data`: its counts, and why shards wait),
// which the error gives, then killed.
func (d *drill) resumeAfterCuts(ctx context.Context, args []string, data string, log *os.File) error {
	r, err := d.startRun(args, log)
	if err != nil {
		return err
	}
	timer := time.NewTimer(resumeLimit)
	defer timer.Stop()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
	case <-timer.C:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	st, serr := exec.CommandContext(sctx, d.cfg.Binary, "status", "--data", data, powerCutRun).CombinedOutput()
	r.kill()
	where := strings.TrimSpace(string(st))
	if serr != nil {
		where = fmt.Sprintf("status: %v %s", serr, where)
	}
	if log != nil {
		fmt.Fprintf(log, "--- not ended after %s; shardpool status --data %s %s:\n%s\n", resumeLimit, data, powerCutRun, where)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("stopped: %w; it stood at: %s", ctx.Err(), where)
	}
	return fmt.Errorf("not ended after %s; it stood at: %s", resumeLimit, where)
}

// groupRun is a `shardpool run` of the power-cut check, in a process
// group of its own so that a kill reaches its commands too.
type groupRun struct {
	cmd  *exec.Cmd
	done chan error // the run's Wait, once it has ended
}

// startRun starts `shardpool args...` with its output to log.
func (d *drill) startRun(args []string, log *os.File) (*groupRun, error) {
	cmd := exec.Command(d.cfg.Binary, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start shardpool run: %w", err)
	}
	r := &groupRun{cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	return r, nil
}

// kill SIGKILLs the run and its commands and waits for the run to end.
func (r *groupRun) kill() {
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.done
}

// resumeLimit bounds the run resumed after the power cuts: 40 shards of
// 0.2 s at 4 at a time, and the leases of the killed runs' shards (3 s)
// to wait out, take seconds.
const resumeLimit = 90 * time.Second

// copyJob writes a job (inputs, manifest, spec) into dir and returns the
// spec's path: run name, shards s00, s01... that each sleep for sleep
// seconds, then copy their input into their output, with retries. The
// power-cut and cluster checks run one each.
func copyJob(dir, name string, shards int, sleep string, retries int) (string, error) {
	if err := os.MkdirAll(filepath.Join(dir, "in"), 0o755); err != nil {
		return "", err
	}
	var m strings.Builder
	for i := range shards {
		in := fmt.Sprintf("in/s%02d.txt", i)
		if err := os.WriteFile(filepath.Join(dir, in), []byte(strings.Repeat(fmt.Sprintf("shard %d\n", i), 512)), 0o644); err != nil {
			return "", err
		}
		fmt.Fprintf(&m, "{\"id\":\"s%02d\",\"inputs\":[%q]}\n", i, in)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte(m.String()), 0o644); err != nil {
		return "", err
	}
	spec := fmt.Sprintf(`name = %q
manifest = "manifest.jsonl"
output = "out"
command = ["sh", "-c", "sleep %s; cp \"$1\" \"$2/\"", "sh", "{input}", "{out}"]
retries = %d
code_rev = "drill"
`, name, sleep, retries)
	path := filepath.Join(dir, "shardpool.toml")
	return path, os.WriteFile(path, []byte(spec), 0o644)
}

// checkAfterPowerCuts reads the records the run left in its store and
// returns what is wrong: a run not COMPLETE, a shard not validated exactly
// once, or an output that does not verify.
func checkAfterPowerCuts(ctx context.Context, data, out string) ([]string, error) {
	c, err := coordinator.New(coordinator.Config{DataDir: data, StoreDir: filepath.Join(data, "stores", powerCutRun), Listen: "127.0.0.1:0"})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := c.Start(cctx); err != nil {
		return nil, fmt.Errorf("open the run's store: %w", err)
	}
	defer c.Close()
	js := c.JetStream()
	r, err := stream.ReadRun(ctx, js, powerCutRun)
	if err != nil {
		return nil, fmt.Errorf("run record: %w", err)
	}
	var bad []string
	if r.State != stream.RunComplete {
		bad = append(bad, fmt.Sprintf("run %s: %s", r.State, r.Reason))
	}
	return append(bad, validatedOnce(ctx, js, powerCutRun, r.Fingerprint, out, powerCutShards)...), nil
}

// removeImages unmounts a power-cut file system and removes its images
// (a few hundred MiB, sparse); the drill's logs stay.
func removeImages(fs *powercut.FS, dir string) {
	_ = fs.Close()
	imgs, _ := filepath.Glob(filepath.Join(dir, "disk*.img"))
	for _, img := range imgs {
		_ = os.Remove(img)
	}
}
