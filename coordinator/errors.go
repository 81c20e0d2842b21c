package coordinator

import "errors"

var (
	// ErrNotReady means the embedded server or JetStream did not become healthy in time.
	ErrNotReady = errors.New("jetstream not ready")
	// ErrConfig names a bad Config field.
	ErrConfig = errors.New("invalid coordinator config")
	// ErrRunNotFound means no run of that name was submitted.
	ErrRunNotFound = errors.New("run not found")
	// ErrDataInUse means another coordinator holds the data directory.
	ErrDataInUse = errors.New("data directory in use by another coordinator")
	// ErrSpecConflict means a resubmitted spec changes what a run with the
	// same fingerprint cannot change (its output directory).
	ErrSpecConflict = errors.New("spec conflicts with the submitted run")
	// ErrReload means the store met a write error (a full disk), which
	// nats-server keeps refusing writes for, and has room again: Run
	// returned so that its caller starts a new Coordinator on the same
	// data (Config.ReloadOnWriteError).
	ErrReload = errors.New("store reload needed after a write error")
	// ErrNothingToHalt means a halt was asked for a run with nothing left
	// to start: COMPLETE, or BLOCKED with nothing queued.
	ErrNothingToHalt = errors.New("nothing to halt")
	// ErrNothingToRetry means a retry was asked for a run with no failed shards.
	ErrNothingToRetry = errors.New("no failed shards to retry")
	// ErrRetryNewGeneration means a retry of failed shards was asked with a
	// spec whose fingerprint differs from the run's: it would start a new
	// generation and run every shard again, not only the failed ones.
	ErrRetryNewGeneration = errors.New("retry of failed shards asked with a changed job")
)
