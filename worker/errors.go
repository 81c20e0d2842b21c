package worker

import "errors"

var (
	// ErrConfig names a bad Config field.
	ErrConfig = errors.New("invalid worker config")
	// ErrLeaseHeld means another live owner holds the shard's lease.
	ErrLeaseHeld = errors.New("lease held by another owner")
	// ErrLeaseLost means the worker could not renew a lease it held.
	ErrLeaseLost = errors.New("lease lost")
	// ErrNameTaken means another live worker reports under the same name.
	ErrNameTaken = errors.New("worker name taken")
	// ErrStaleGeneration means a message belongs to a run generation that was replaced.
	ErrStaleGeneration = errors.New("message of a replaced run generation")
	// ErrOtherRunsOutput means a shard's destination holds the committed
	// output of another run, which the shard's commit would replace.
	ErrOtherRunsOutput = errors.New("the destination holds another run's output")
	// ErrForeignDestination means a shard's destination holds something
	// that is no shardpool output: a file, or a directory without a
	// COMPLETE marker. It is left as it is.
	ErrForeignDestination = errors.New("not a shardpool output")
)
