package stream

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

var (
	// ErrInvalidSpec wraps every problem found in a run spec; the message names
	// the file, the line where known, and the field.
	ErrInvalidSpec = errors.New("invalid run spec")
	// ErrInvalidManifest wraps every problem found in a manifest line.
	ErrInvalidManifest = errors.New("invalid manifest")
	// ErrSchemaVersion means a stored value was written by a newer shardpool.
	ErrSchemaVersion = errors.New("unknown schema version")
	// ErrPlaceholder means a command placeholder cannot be expanded for a shard.
	ErrPlaceholder = errors.New("placeholder cannot be expanded")
	// ErrNotDurable means a sync barrier failed: what was written may not
	// survive a host crash, so the writer must not act on it yet.
	ErrNotDurable = errors.New("not yet durable")
	// ErrStoreFull means the coordinator's JetStream store refused a write
	// for want of space: nothing more can be queued, leased or recorded
	// until space is freed on its file system.
	ErrStoreFull = errors.New("the coordinator's store is out of space: free space on the file system of its --data, then resume")
)

// jsInsufficientResources is JetStream's error code for a store (or
// memory) at its limit.
const jsInsufficientResources = 10023

// IsStoreFull reports whether err is JetStream refusing a write for want
// of space.
func IsStoreFull(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jsInsufficientResources
}

// Explain wraps err with ErrStoreFull when it is JetStream refusing a write
// for want of space, and returns it unchanged otherwise.
func Explain(err error) error {
	if IsStoreFull(err) {
		return fmt.Errorf("%w (%v)", ErrStoreFull, err)
	}
	return err
}
