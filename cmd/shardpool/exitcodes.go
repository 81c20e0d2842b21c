package main

import "errors"

// Exit codes, documented in docs/cli.md and the usage text.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitBlocked     = 3
	exitUnverified  = 4
	exitInterrupted = 130
)

// errUsage means the command line was wrong; the usage was already printed.
var errUsage = errors.New("usage")

// exitErr carries a specific exit code and a message to print.
type exitErr struct {
	code int
	msg  string
}

func (e exitErr) Error() string { return e.msg }

// commandExits is each command's exit codes, which its --help lists
// after its flags (keyed by the name given to newFlags; each entry starts
// with its code). Every command exits 2 on a usage error and 1 on any
// other error; docs/cli.md has the same.
var commandExits = map[string][]string{
	"run": {
		"0 the run is COMPLETE (outputs verified at the destination)",
		"1 error (a bad spec or manifest, named by file, line and field: nothing queued; I/O; another run holds the output)",
		"2 usage",
		"3 BLOCKED, or halted by --halt (the command that retries is printed and in DATA/runs/RUN/resume.txt)",
		"130 interrupted (SIGINT, SIGTERM, SIGHUP) or drained by SIGUSR1 before the run completed: state kept, the printed command resumes",
	},
	"coordinator": {
		"0 stopped by SIGTERM, SIGINT or SIGHUP, state kept under --data",
		"1 error (--data unusable, a listener's address taken, a cluster that does not form)",
		"2 usage",
	},
	"worker": {
		"0 stopped by SIGTERM, SIGINT or SIGHUP, or drained by SIGUSR1 (running shards finished or handed back), or idle for --idle-exit",
		"1 error, or it stopped itself (--stop-after-start-failures, --stop-when-failing-alone, a coordinator gone or refusing it past --connect-wait)",
		"2 usage",
	},
	"submit": {
		"0 published, or nothing new to publish (the same run again); with --wait, the run is COMPLETE",
		"1 error (a bad spec or manifest: nothing published; no coordinator answers)",
		"2 usage",
		"3 BLOCKED before queuing (a class no live worker could run); with --wait, the run ended BLOCKED",
		"130 --wait interrupted before the verdict (the run goes on with its workers)",
	},
	"status": {
		"0 the state was printed, whatever it is; with --wait, the run is COMPLETE",
		"1 error (no coordinator answers, an unknown run; with --wait, a run that stopped before its verdict and that nothing serves)",
		"2 usage (several runs and no RUN named)",
		"3 with --wait: the run is BLOCKED",
		"130 --wait interrupted before the verdict (the run goes on)",
	},
	"forget": {
		"0 the run was removed, its outputs kept",
		"1 error (the run is PREPARED, QUEUED or RUNNING: refused, nothing changed; no coordinator answers)",
		"2 usage",
	},
	"halt": {
		"0 the run is halted (now, or it was already)",
		"1 error (an unknown run; nothing to halt: COMPLETE, or BLOCKED with nothing queued, and with --now nothing running; no coordinator answers)",
		"2 usage",
	},
	"sbatch": {
		"0 the job was submitted (or printed, --dry-run)",
		"1 error (sbatch missing or refusing the job, no coordinator answers)",
		"2 usage",
	},
	"profile": {
		"0 measured",
		"1 error, or a correctness check stopped it",
		"2 usage",
		"130 interrupted",
	},
	"plan": {
		"0 planned",
		"1 error",
		"2 usage",
		"3 BLOCKED: a shard can never run on this host",
	},
	"stage": {
		"0 every input staged and verified",
		"1 error (a copy that fails its checksum, no room)",
		"2 usage",
		"130 interrupted: what was copied is kept, staging again resumes",
	},
	"preflight": {
		"0 the snapshot was printed (a probe that failed shows as unknown)",
		"1 error",
		"2 usage",
	},
	"drill": {
		"0 every check passed",
		"1 a check failed (see the table) or error",
		"2 usage",
		"130 interrupted",
	},
	"version": {
		"0 printed",
		"2 usage",
	},
	"ckpt commit": {
		"0 committed, its path printed",
		"1 error (nothing to commit, I/O)",
		"2 usage",
	},
	"ckpt latest": {
		"0 the newest generation that verifies was printed",
		"1 error",
		"2 usage",
		"4 no generation verifies",
	},
	"ckpt replicate": {
		"0 copied and verified at DEST",
		"1 error",
		"2 usage",
		"4 no generation verifies",
	},
	"ckpt verify": {
		"0 every generation (or the output) verifies",
		"1 error",
		"2 usage",
		"4 one failed, or none exist",
	},
}
